"""Fact parsers on the shapes the case files do not cover."""
import pytest

from llmgw.facts import host, journal


def test_quoted_os_release_values_are_unquoted():
    got = host.parse_os_release(['ID="rocky"', 'ID_LIKE="rhel centos fedora"', "VERSION_ID='9.4'"])
    assert got["id"] == "rocky" and got["like"] == ["rhel", "centos", "fedora"] and got["version"] == "9.4"


def test_packaging_family_comes_from_id_like():
    assert host.packaging_family({"id": "linuxmint", "like": ["ubuntu", "debian"]}) == "deb"
    assert host.packaging_family({"id": "rocky", "like": ["rhel", "centos", "fedora"]}) == "rpm"
    assert host.packaging_family({"id": "alpine", "like": []}) == ""


def test_a_driver_file_without_a_module_line_means_no_driver():
    assert host.parse_nvidia_driver(["NVRM: loading failed"]) == ""
    assert host.parse_nvidia_driver([
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build"]) == "560.35.03"


def test_cut_short_discovery_is_an_error():
    with pytest.raises(ValueError, match="cut short"):
        host.parse_discovery("== os-release\nID=debian\n")


def test_file_log_output_resumes_after_what_was_read():
    lines, nxt = journal.parse_file_output("120\nfirst\nsecond\n", offset="100")
    assert [line["text"] for line in lines] == ["first", "second"] and nxt == str(100 + len("first\nsecond\n"))
    lines, nxt = journal.parse_file_output("120\nlast\n")
    assert nxt == "120"


def test_journal_argv_follows_a_cursor():
    assert journal.journal_argv("llmgw-a", 10, "s=1")[-2:] == ["--after-cursor", "s=1"]
    assert journal.journal_argv("llmgw-a", 10)[-2:] == ["-n", "10"]


def test_a_port_counts_as_taken_when_anything_but_time_wait_holds_it():
    from llmgw.facts import ports
    text = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:4650 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:9C40 0100007F:4650 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:9C41 0100007F:4650 06 00000000:00000000 03:00000000 00000000     0        0 0 3
"""
    # 18000 listens; 40000 is the source port of a connection; 40001 only lingers in TIME_WAIT.
    assert ports.parse_taken(text) == {18000, 40000}


def test_interface_addresses_come_ipv4_first_and_vlans_by_their_own_name():
    lines = ["2: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever",
             "2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever",
             "5: eth0.10@eth0    inet 10.10.0.7/16 brd 10.10.255.255 scope global eth0.10",
             "garbage"]
    assert host.parse_addresses(lines) == {"eth0": ["192.0.2.2", "fd00::2"], "eth0.10": ["10.10.0.7"]}


def test_an_engine_listens_on_the_management_address_when_there_is_one():
    from types import SimpleNamespace

    from llmgw.errors import LlmgwError
    from llmgw.services.engine_http import endpoint_of
    from llmgw.services.serving import listen_host

    def node(iface, addresses, transport="ssh"):
        return SimpleNamespace(name="gpu-1", addr="203.0.113.9", transport=transport,
                               mgmt_interface=iface, facts={"addresses": addresses})

    on_mgmt = node("eth1", {"eth0": ["203.0.113.9"], "eth1": ["10.0.0.5", "fd00::5"]})
    assert listen_host(on_mgmt) == "10.0.0.5" and endpoint_of(on_mgmt, 18001) == "http://10.0.0.5:18001"
    plain = node("", {"eth0": ["203.0.113.9"]})
    assert listen_host(plain) == "0.0.0.0" and endpoint_of(plain, 18001) == "http://203.0.113.9:18001"
    v6 = node("eth1", {"eth1": ["fd00::5"]})
    assert listen_host(v6) == "fd00::5" and endpoint_of(v6, 18001) == "http://[fd00::5]:18001"
    assert listen_host(node("eth1", {}, transport="local")) == "127.0.0.1"
    missing = node("eth9", {"eth0": ["203.0.113.9"]})
    with pytest.raises(LlmgwError, match=r"management interface 'eth9' has no address \(interfaces "
                                         r"with one: eth0 \(203.0.113.9\)\); run add-node gpu-1 again"):
        listen_host(missing)
    assert endpoint_of(missing, 18001) == "http://203.0.113.9:18001"  # a running engine stays reachable
    older = SimpleNamespace(name="gpu-1", addr="203.0.113.9", transport="ssh", mgmt_interface="eth1",
                            facts={"gpus": []})  # discovered before addresses were recorded
    assert listen_host(older) == "0.0.0.0" and endpoint_of(older, 18001) == "http://203.0.113.9:18001"
