"""Local clusters: ports, TF_CONFIG, the child-to-parent protocol, and tasks that fail or hang."""

import json
import sys

import pytest

from conftest import REPO
from tfperf import flags
from tfperf.cluster.errors import ClusterError
from tfperf.cluster.placement import Placement
from tfperf.cluster.processes import LocalCluster, free_ports, local_cluster, tf_config
from tfperf.measure.processes import ChildError, last_reply, replies, reply


def test_ports_and_tf_config():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    cluster = local_cluster({"chief": 1, "worker": 2, "ps": 0})
    assert set(cluster) == {"chief", "worker"} and len(cluster["worker"]) == 2
    config = json.loads(tf_config(cluster, "worker", 1))
    assert config == {"cluster": cluster, "task": {"type": "worker", "index": 1}}


def test_reply_round_trip_and_missing_reply():
    output = "noise\n" + reply({"step_s": 0.5, "sizes": [1, 2]}) + "\n{\"not\": \"a reply\"}\n" + reply([3]) + "\n"
    assert replies(output) == [{"step_s": 0.5, "sizes": [1, 2]}, [3]] and last_reply(output) == [3]
    with pytest.raises(ChildError, match="worker0 exited without printing its result"):
        last_reply("no result here", "worker0")


def test_failed_task_is_named_with_its_log(tmp_path):
    with LocalCluster(tmp_path) as procs:
        procs.start("ok", [sys.executable, "-c", "print('fine')"], {})
        procs.start("bad", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], {})
        with pytest.raises(ClusterError, match=r"task bad exited with 3(.|\n)*boom"):
            procs.wait(timeout=60)


def test_hung_task_hits_the_deadline_and_is_killed(tmp_path):
    with LocalCluster(tmp_path) as procs:
        hung = procs.start("server", [sys.executable, "-c", "import time; time.sleep(600)"], {})
        with pytest.raises(ClusterError, match="server did not finish within 1 s"):
            procs.wait(timeout=1)
    assert hung.poll() is not None  # leaving the block killed it


def test_cluster_flags_are_shared_and_a_bad_link_is_one_line(capsys):
    p = flags.ArgumentParser()
    flags.add_cluster_flags(p, sizes_help="bytes", link_help="run each worker on a host of its own")
    args = p.parse_args(["--workers", "3", "--sizes", "1024", "4096"])
    assert (args.workers, args.sizes, args.timeout, args.link) == (3, [1024, 4096], 600, None)
    assert p.parse_args(["--link", "1gbit"]).link == "1gbit"
    with pytest.raises(SystemExit) as exit_:
        p.parse_args(["--link", "fast"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "give a rate such as 1gbit" in err


class FakeHosts:
    """Two hosts' addresses and commands, without root: what Placement reads of tfperf.cluster.hosts.Hosts."""

    addresses = ["10.77.0.1", "10.77.0.2"]

    def command(self, host, argv):
        return ["in", f"host{host}", *map(str, argv)]


def test_a_placement_puts_each_task_on_its_host_at_that_hosts_address():
    here = Placement()
    assert all(a.startswith("localhost:") for a in here.cluster({"worker": 2})["worker"])
    assert here.command("worker", 1, ["python", 3]) == ["python", "3"] and here.where("ps", 0) == "localhost"
    apart = Placement(FakeHosts(), lambda job, index: 1 if job == "ps" else 0)
    cluster = apart.cluster({"chief": 1, "worker": 2, "ps": 1})
    assert [a.split(":")[0] for a in cluster["worker"] + cluster["chief"]] == ["10.77.0.1"] * 3
    assert cluster["ps"][0].startswith("10.77.0.2:")
    ports = [a.split(":")[1] for role in cluster.values() for a in role]
    assert len(set(ports)) == 4  # tasks that share a host never share a port
    assert apart.command("ps", 0, ["python"]) == ["in", "host1", "python"] and apart.where("worker", 1) == "10.77.0.1"


def test_loopback_hosts_run_on_this_machine_with_the_same_interface():
    from tfperf.cluster.hosts import Loopback

    with Loopback(2, cores=[[0], [0]]) as hosts:
        assert hosts.addresses == ["127.0.0.1", "127.0.0.1"] and hosts.link is None and hosts.shared_cores
        assert hosts.command(1, ["python", "-V"]) == ["taskset", "-c", "0", "python", "-V"]
        run = hosts.horovodrun(["python", "x.py"])
        assert run[1:5] == ["-np", "2", "-H", "localhost:2"] and run[-2:] == ["python", "x.py"]
        assert hosts.horovodrun(["x"], on=[0])[1:5] == ["-np", "1", "-H", "localhost:1"]
        measured = hosts.measure(0, 1, megabytes=4, pings=20)
        assert measured.bits_per_s > 1e8 and 0 < measured.rtt_s < 0.05
    assert not hosts.dir.exists()


@pytest.mark.parametrize("name", ["multi_worker", "parameter_server"])
def test_hosts_that_fail_end_a_cluster_recipe_in_one_line(name, monkeypatch, capsys):
    """A link that cannot be shaped (tc refused, sshd silent) ends a cluster recipe's --link in one line, exit 1."""
    import importlib

    sys.path.insert(0, str(REPO / "recipes"))
    recipe = importlib.import_module(name)
    from tfperf.cluster import hosts

    def refuse(*args, **kwargs):
        raise hosts.HostsError("tc tbf on tfpv0 failed: RTNETLINK answers: Operation not permitted")

    monkeypatch.setattr(hosts, "available", lambda: None)
    monkeypatch.setattr(recipe, "available", lambda: None)
    monkeypatch.setattr(hosts.Hosts, "__init__", refuse)
    assert recipe.RECIPE.main(["--quick", "--link", "1gbit", "--out", "/nonexistent/never-written"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"{name}: failed: tc tbf on tfpv0 failed: RTNETLINK answers: Operation not permitted"], err
