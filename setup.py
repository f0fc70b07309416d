from setuptools import find_packages, setup

setup(
    name="horovod_sparse",
    version="0.1.0",
    description="Sparse gradient exchange (MiCRO, ExDyna, DEFT, Top-k, ...) for Horovod",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["horovod_sparse", "horovod_sparse.*"]),
    python_requires=">=3.9",
    install_requires=["numpy", "numba"],
    extras_require={
        "torch": ["torch>=2.0"],
        "tensorflow": ["tensorflow-cpu>=2.12"],
        "mpi": ["mpi4py"],
        "test": ["pytest", "pytest-timeout", "scikit-learn"],
    },
)
