# horovod_sparse: `make demo` and `make test` set everything up themselves.
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.horovod_sparse-installed
export OMP_NUM_THREADS ?= 1

.PHONY: install demo test test-core bench clean

install: $(STAMP)

$(STAMP): scripts/setup.sh setup.py
	bash scripts/setup.sh
	touch $@

demo: install
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) examples/demo.py
	$(PY) benchmarks/multihost.py --demo

test: install
	$(PY) -m pytest tests --durations=15

bench: install
	$(PY) benchmarks/selection_cost.py
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/rebalance.py
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/dense_below.py
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/fallback.py
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/fallback.py --page fallback_2ranks.md
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/fallback.py --steady 100
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/fallback.py --steady 100 \
		--page fallback_steady_2ranks.md
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/sparse_allreduce.py
	mpirun --allow-run-as-root -np 2 $(PY) benchmarks/sparse_allreduce.py --communicator mpi
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/convergence.py --density 0.01
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/convergence.py --density 0.001
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/convergence.py --methods dense,deft,deft/paper \
		--epochs 12 --page deft_budget
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/convergence.py --density 0.01 \
		--methods dense,dgc,dgc/paper --epochs 12 --page dgc_paper
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/convergence.py --density 0.001 \
		--methods gssgd,gssgd:columns=1360,gssgd:columns=5440,gssgd:rows=11,gssgd:rows=12 \
		--page gssgd_sketch_size
	$(PY) benchmarks/sketch_recall.py
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/convergence.py --framework tensorflow
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/convergence.py --task charlm --density 0.01
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/convergence.py --task charlm --density 0.001
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/synthetic.py --docs --iters 3 \
		--compression dense,topk,gtopk,randomk,threshold,dgc,cltk,gssgd,micro,exdyna,deft
	$(PY) benchmarks/multihost.py --rates 1gbit,10gbit
	$(PY) benchmarks/multihost.py --fallback
	$(PY) benchmarks/multihost.py --rates 1gbit --methods dense,gtopk,gssgd,gssgd/tree \
		--page gssgd_multihost
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/threshold_control.py
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/gossip.py
	$(VENV)/bin/horovodrun -np 4 --gloo $(PY) benchmarks/gossip.py --task charlm
	$(PY) benchmarks/time_to_quality.py --rates 1gbit,100mbit
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) benchmarks/soak.py

test-core: install
	$(PY) -m pytest tests -m "not horovod"

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
