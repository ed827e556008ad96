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
