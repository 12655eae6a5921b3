"""Jobs across hosts: the launcher on the test hosts (``tests/hosts.py``: network namespaces
on a bridge, each with its own address, host name and sshd; Hydra's ``mpiexec`` starts the
ranks there over ssh, gloo runs over the bridge).

- the test hosts themselves: each answers ssh with its own name and address; a host cut off
  answers nothing until its link is back;
"""
from __future__ import annotations

import subprocess

import pytest


def ssh(hosts, addr: str, cmd: str, timeout: float = 15) -> subprocess.CompletedProcess:
    return subprocess.run([str(hosts.ssh), addr, cmd], capture_output=True, text=True, timeout=timeout)


def test_each_test_host_has_its_own_name_and_address_and_a_cut_host_answers_nothing(test_hosts):
    for h in test_hosts.hosts:
        out = ssh(test_hosts, h.addr, "hostname; ip -4 -o addr show eth0")
        assert out.returncode == 0, out.stderr
        name, iface = out.stdout.splitlines()[:2]
        assert name == h.hostname and f"inet {h.addr}/" in iface
    h1, h2 = test_hosts.host(1), test_hosts.host(2)
    # host 1 reaches host 2 directly (over the bridge, not through this process)
    out = ssh(test_hosts, h1.addr, f"exec 3<>/dev/tcp/{h2.addr}/22 && head -c 7 <&3")
    assert out.stdout == "SSH-2.0", out.stderr
    test_hosts.cut(h2)
    try:
        with pytest.raises(subprocess.TimeoutExpired):          # (no answer: the connection waits)
            ssh(test_hosts, h2.addr, "true", timeout=1.5)
    finally:
        test_hosts.restore(h2)
    test_hosts.wait_ssh(20, [h2])
