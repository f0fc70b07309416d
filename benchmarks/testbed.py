"""A two-host test bed on one machine: network namespaces, sshd, a shaped link.

    python benchmarks/testbed.py up [--rate 1gbit]   # build (idempotent)
    python benchmarks/testbed.py down                 # remove everything it made
    python benchmarks/testbed.py run -- horovodrun -np 4 -H ... python train.py
    python benchmarks/testbed.py status

``up`` makes two "hosts", each a network namespace (``hs-h1``, ``hs-h2``)
joined by a veth pair whose ends carry the **same** interface name
(``hsnet0``, which Horovod's ``--network-interfaces`` and Open MPI's
``btl_tcp_if_include`` need), private addresses 10.231.0.1 and .2, and an
``sshd`` (key-only, port 2222) started inside each namespace *and* its own UTS
namespace, with its own hostname (``hs-node1``, ``hs-node2``: with a shared
hostname Open MPI takes both for one node).  The hostnames resolve through
lines added to ``/etc/hosts`` (marked, removed by ``down``).  The key pair,
sshd configuration and pid files live in ``/tmp/hs-testbed``.  ``--rate``
shapes both ends of the link with a token bucket (``tc ... tbf``); without it
the link is unshaped.

``run`` starts a command on host 1 (in its namespaces), where the launcher
reaches both hosts; :func:`horovodrun_args` and :func:`mpirun_args` give the
flags a launcher needs.  Everything needs root; without it the script says so
and exits.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

STATE = "/tmp/hs-testbed"
KEY = os.path.join(STATE, "id_ed25519")
PORT = 2222
INTERFACE = "hsnet0"
HOSTS = [("hs-h1", "hs-node1", "10.231.0.1"), ("hs-h2", "hs-node2", "10.231.0.2")]
MARK = "# horovod_sparse testbed"
HOSTS_FILE = "/etc/hosts"


class TestbedError(RuntimeError):
    pass


def require_root():
    if os.geteuid() != 0:
        raise TestbedError("the multi-host test bed needs root (network namespaces, sshd, tc); "
                           "run it as root")
    for tool in ("ip", "tc", "unshare", "nsenter", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise TestbedError(f"the test bed needs {tool!r} (make install installs it)")
    if not os.path.exists("/usr/sbin/sshd"):
        raise TestbedError("the test bed needs sshd (Debian's openssh-server; make install)")


def _sh(*command, check=True, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise TestbedError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result


def _namespaces():
    return _sh("ip", "netns", "list").stdout.split()


def _pid_file(host):
    return os.path.join(STATE, f"sshd-{host}.pid")


def _sshd_alive(host):
    try:
        with open(_pid_file(host)) as f:
            pid = int(f.read())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def up(rate=None):
    """Build the bed (or leave it as it is) and shape the link to ``rate``."""
    require_root()
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    if not os.path.exists(KEY):
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", KEY)
    host_key = os.path.join(STATE, "host_key")
    if not os.path.exists(host_key):
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key)
    shutil.copy(KEY + ".pub", os.path.join(STATE, "authorized_keys"))
    if not all(namespace in _namespaces() for namespace, _, _ in HOSTS):
        _make_link()
    _add_host_names()
    os.makedirs("/run/sshd", exist_ok=True)
    for namespace, hostname, address in HOSTS:
        if _sshd_alive(namespace) is None:
            _start_sshd(namespace, hostname, address)
    shape(rate)
    for _, hostname, _ in HOSTS:
        _wait_for_ssh(hostname)


def _make_link():
    down_link()
    for namespace, _, _ in HOSTS:
        _sh("ip", "netns", "add", namespace)
    _sh("ip", "link", "add", "hsv1", "type", "veth", "peer", "name", "hsv2")
    for (namespace, _, address), end in zip(HOSTS, ("hsv1", "hsv2")):
        _sh("ip", "link", "set", end, "netns", namespace)
        run_in = ("ip", "netns", "exec", namespace)
        _sh(*run_in, "ip", "link", "set", end, "name", INTERFACE)
        _sh(*run_in, "ip", "addr", "add", f"{address}/24", "dev", INTERFACE)
        _sh(*run_in, "ip", "link", "set", INTERFACE, "up")
        _sh(*run_in, "ip", "link", "set", "lo", "up")


def _add_host_names():
    with open(HOSTS_FILE) as f:
        lines = [line for line in f.read().splitlines() if MARK not in line]
    lines += [f"{address} {hostname} {MARK}" for _, hostname, address in HOSTS]
    with open(HOSTS_FILE, "w") as f:
        f.write("\n".join(lines) + "\n")


def _start_sshd(namespace, hostname, address):
    config = os.path.join(STATE, f"sshd-{namespace}.conf")
    with open(config, "w") as f:
        f.write(f"Port {PORT}\nListenAddress {address}\nHostKey {STATE}/host_key\n"
                f"AuthorizedKeysFile {STATE}/authorized_keys\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                "StrictModes no\nUsePAM no\nAcceptEnv *\n"
                f"PidFile {_pid_file(namespace)}\n")
    subprocess.Popen(["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
                      f"hostname {hostname} && exec /usr/sbin/sshd -D -f {config}"],
                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(STATE, f"sshd-{namespace}.log"), "w"),
                     start_new_session=True)
    deadline = time.time() + 10
    while _sshd_alive(namespace) is None:
        if time.time() > deadline:
            raise TestbedError(f"sshd did not start in {namespace} (see {STATE}/sshd-{namespace}.log)")
        time.sleep(0.1)


def ssh_command(hostname):
    return ["ssh", "-p", str(PORT), "-i", KEY, "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
            hostname]


def _wait_for_ssh(hostname):
    deadline = time.time() + 20
    while True:
        result = subprocess.run(["ip", "netns", "exec", HOSTS[0][0], *ssh_command(hostname),
                                 "hostname"], capture_output=True, text=True)
        if result.returncode == 0 and result.stdout.strip() == hostname:
            return
        if time.time() > deadline:
            raise TestbedError(f"ssh to {hostname} failed: {result.stderr.strip()}")
        time.sleep(0.2)


def shape(rate=None):
    """Token-bucket ``rate`` (e.g. ``"1gbit"``) on both ends of the link; ``None`` unshapes."""
    for namespace, _, _ in HOSTS:
        run_in = ("ip", "netns", "exec", namespace)
        _sh(*run_in, "tc", "qdisc", "del", "dev", INTERFACE, "root", check=False)
        if rate:
            _sh(*run_in, "tc", "qdisc", "add", "dev", INTERFACE, "root", "tbf", "rate", rate,
                "burst", "1mb", "latency", "50ms")


def down_link():
    for namespace, _, _ in HOSTS:
        if namespace in _namespaces():
            _sh("ip", "netns", "del", namespace)


def down():
    """Stop the sshd processes (by pid), delete the namespaces and the link, the
    /etc/hosts lines and the state directory (keys)."""
    require_root()
    for namespace, _, _ in HOSTS:
        pid = _sshd_alive(namespace)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
    down_link()
    with open(HOSTS_FILE) as f:
        lines = [line for line in f.read().splitlines() if MARK not in line]
    with open(HOSTS_FILE, "w") as f:
        f.write("\n".join(lines) + "\n")
    shutil.rmtree(STATE, ignore_errors=True)


def status():
    namespaces = _namespaces()
    return {namespace: {"namespace": namespace in namespaces, "sshd_pid": _sshd_alive(namespace)}
            for namespace, _, _ in HOSTS}


def on_host1(command):
    """``command`` (a list) run on host 1: its network and UTS namespaces."""
    return ["ip", "netns", "exec", HOSTS[0][0], "unshare", "--uts", "sh", "-c",
            f'hostname {HOSTS[0][1]} && exec "$@"', "sh", *command]


def horovodrun_args(slots=2):
    hosts = ",".join(f"{hostname}:{slots}" for _, hostname, _ in HOSTS)
    return ["-H", hosts, *horovodrun_link_args()]


def horovodrun_link_args():
    """How horovodrun reaches the hosts (without ``-H``: elastic jobs discover them)."""
    return ["-p", str(PORT), "--ssh-identity-file", KEY, "--network-interfaces", INTERFACE]


def mpirun_args(slots=2):
    hosts = ",".join(f"{hostname}:{slots}" for _, hostname, _ in HOSTS)
    return ["-H", hosts, "--mca", "plm_rsh_args",
            f"-p {PORT} -i {KEY} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            "-o LogLevel=ERROR", "--mca", "btl_tcp_if_include", INTERFACE,
            "--mca", "oob_tcp_if_include", INTERFACE]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("up", help="build the bed (idempotent)")
    start.add_argument("--rate", help="shape the link, e.g. 1gbit or 10gbit (default: unshaped)")
    sub.add_parser("down", help="remove everything the bed made")
    sub.add_parser("status")
    run = sub.add_parser("run", help="run a command on host 1")
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    try:
        if args.action == "up":
            up(args.rate)
        elif args.action == "down":
            down()
        elif args.action == "status":
            print(status())
        else:
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            sys.exit(subprocess.call(on_host1(command)))
    except TestbedError as error:
        sys.exit(f"testbed: {error}")


if __name__ == "__main__":
    main()
