"""Pure plans: builds per host, placement and adoption, archive safety, packages, launch argv."""
import pytest

from llmgw.plans import archive, launch, packages, placement
from llmgw.plans.engines import Unsupported, choose, slow_cpu_warning

X64 = {"arch": "amd64", "machine": "x86_64", "cpu_flags": ["avx", "avx2"], "nvidia_driver": ""}


def test_an_x64_host_gets_the_cpu_build():
    b = choose("llamacpp", "b10991", X64)
    assert b.variant == "cpu"
    assert b.assets == ("llama-b10991-bin-ubuntu-x64.tar.gz",)
    assert b.packages == {"deb": ("libgomp1",), "rpm": ("libgomp",)}


def test_an_arm64_host_gets_the_arm64_asset():
    b = choose("llamacpp", "b10991", {"arch": "arm64", "cpu_flags": ["asimd"]})
    assert b.assets == ("llama-b10991-bin-ubuntu-arm64.tar.gz",)
    assert slow_cpu_warning(b, {"cpu_flags": ["asimd"]}) == ""


def test_a_host_with_an_nvidia_driver_gets_the_cuda_and_cudart_assets():
    b = choose("llamacpp", "b10991", dict(X64, nvidia_driver="550.54.15"))
    assert b.variant == "cuda-12.8"
    assert b.assets == ("llama-b10991-bin-ubuntu-cuda-12.8-x64.tar.gz",
                        "cudart-llama-b10991-bin-ubuntu-cuda-12.8-x64.tar.gz")


def test_riscv64_is_unsupported_with_a_reason():
    with pytest.raises(Unsupported, match="no Linux build for riscv64"):
        choose("llamacpp", "b10991", {"arch": "riscv64", "machine": "riscv64"})


def test_a_cpu_without_avx2_gets_a_standing_warning():
    b = choose("llamacpp", "b10991", X64)
    warning = slow_cpu_warning(b, {"cpu_flags": ["avx"]})
    assert "lacks AVX2" in warning and "several times slower" in warning


def test_the_simulated_engine_needs_python3():
    with pytest.raises(Unsupported, match="python3"):
        choose("sim", "builtin", {"tools": []})


def test_free_port_skips_used_ones():
    assert placement.free_port({18000, 18001}, "18000-18010") == 18002
    with pytest.raises(ValueError, match="widen reconciler.port_range"):
        placement.free_port({1, 2}, "1-2")


@pytest.mark.parametrize("members,expected", [
    ([("build/bin/llama-server", "file", "")], []),
    ([("build/bin/libllama.so", "symlink", "libllama.so.1")], []),
    ([("../../etc/cron.d/x", "file", "")], ["../../etc/cron.d/x would unpack outside the install directory"]),
    ([("/etc/passwd", "file", "")], ["/etc/passwd would unpack outside the install directory"]),
    ([("build/lib", "symlink", "../../../usr/lib")], ["build/lib is a link to ../../../usr/lib, outside the install directory"]),
    ([("build/x", "symlink", "/etc/shadow")], ["build/x is a link to /etc/shadow, outside the install directory"]),
    ([("dev", "other", "")], ["dev is a device or FIFO, which a release archive has no need of"]),
])
def test_archive_members_outside_the_directory_are_refused(members, expected):
    assert archive.refusals(members) == expected


def test_debian_family_installs_with_apt_get_and_a_lock_timeout():
    tool, cmds = packages.install_plan("deb", ["libgomp1"], ["apt-get"])
    assert tool == "apt-get"
    assert cmds[-1][-4:] == ["install", "-y", "--no-install-recommends", "libgomp1"]


def test_rpm_family_prefers_dnf():
    assert packages.install_plan("rpm", ["libgomp"], ["yum", "dnf"]) == ("dnf", [["dnf", "install", "-y", "libgomp"]])


def test_a_held_lock_is_recognised():
    assert packages.lock_held("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1234")
    assert not packages.lock_held("E: Unable to locate package libgomp1x")


def test_systemd_launch_is_a_transient_unit_with_restart():
    argv = launch.start_argv("systemd", "llmgw-m-0", ["/opt/x/llama-server", "-m", "a b"], "/opt/llmgw")
    assert argv[:3] == ["systemd-run", "--unit=llmgw-m-0", "--property=Restart=on-failure"]
    assert argv[-3:] == ["/opt/x/llama-server", "-m", "a b"]


def test_systemd_launch_keeps_a_dollar_in_an_argument_from_being_expanded():
    # systemd expands $VAR and ${VAR} in ExecStart when it starts the unit; $$ is one dollar.
    argv = launch.start_argv("systemd", "llmgw-m-0", ["/opt/x/llama-server", "--alias", "a${HOME}$x$$"],
                             "/opt/llmgw", {"HF_HOME": "/x"})
    assert argv[-3:] == ["/opt/x/llama-server", "--alias", "a$${HOME}$$x$$$$"]
    assert "--setenv=HF_HOME=/x" in argv


def test_fallback_launch_keeps_user_strings_as_arguments():
    argv = launch.start_argv("setsid", "llmgw-m-0", ["python3", "x.py", "$(id)"], "/opt/llmgw")
    assert argv[-1] == "$(id)" and "setsid" in argv


def test_units_are_parsed_from_listings():
    listed = "llmgw-a-0 active\nllmgw-b-1 activating\nllmgw-c-2\nother x\n"
    assert launch.parse_units(listed) == {"a-0": "active", "b-1": "activating", "c-2": "active"}


def test_supervisor_is_systemd_only_as_root_under_systemd():
    assert launch.supervisor_for({"systemd": True, "uid": 0}) == "systemd"
    assert launch.supervisor_for({"systemd": True, "uid": 1000}) == "setsid"
    assert launch.supervisor_for({"systemd": False, "uid": 0}) == "setsid"


from llmgw.plans.replica_state import next_step, retry_delay  # noqa: E402


@pytest.mark.parametrize("state,running,healthy,age,failures,expected", [
    ("starting", True, True, 1, 0, "ready"),
    ("ready", True, True, 1, 0, "wait"),
    ("ready", True, False, 1, 0, "unhealthy"),
    ("unhealthy", True, False, 100, 0, "wait"),
    ("unhealthy", True, False, 181, 0, "give_up"),
    ("starting", True, False, 181, 0, "give_up"),
    ("pending", True, False, 1, 0, "adopt"),
    ("starting", False, False, 1, 0, "crashed"),
    ("ready", False, False, 1, 0, "crashed"),
    ("failed", False, False, 0, 1, "start"),  # the first failure is retried at once
    ("failed", False, False, 10, 2, "wait"),
    ("failed", False, False, 31, 2, "start"),
    ("failed", False, False, 100, 4, "wait"),
    ("pending", False, False, 0, 0, "start"),
])
def test_a_replica_s_next_step(state, running, healthy, age, failures, expected):
    assert next_step(state, running, healthy, age, 180, failures) == expected


def test_failed_starts_back_off_to_ten_minutes():
    assert [retry_delay(n) for n in (1, 2, 3, 4, 7, 10)] == [0, 30, 60, 120, 600, 600]


def test_a_chain_of_links_cannot_climb_out():
    chain = [("a/b", "symlink", ".."), ("a/b/x", "symlink", ".."), ("a/b/x/evil", "file", "")]
    said = archive.refusals(chain)
    assert "a/b is a link to .., outside the install directory" in said
    assert "a/b/x would be written through the link a/b" in said
    assert "a/b/x/evil would be written through the link a/b" in said


from llmgw.plans import routing  # noqa: E402


def test_least_outstanding_goes_first_and_ties_rotate():
    eps = ["a", "b", "c"]
    assert routing.order(eps, {"a": 3, "b": 0, "c": 1}, 0)[0] == "b"
    firsts = {routing.order(eps, {}, turn)[0] for turn in range(3)}
    assert firsts == {"a", "b", "c"}


def test_a_session_sticks_to_its_endpoint_while_it_is_not_overloaded():
    eps = ["a", "b", "c"]
    home = routing.order(eps, {}, 0, session="alice")[0]
    assert all(routing.order(eps, {}, t, session="alice")[0] == home for t in range(5))
    busy = {home: 10}
    assert routing.order(eps, busy, 0, session="alice")[0] != home


UUIDS = ("GPU-aaaa", "GPU-bbbb")


def env_of(engine, cards=UUIDS, indexes=(5, 7)):
    return launch.gpu_env(launch.Serve(engine=engine, binary="x", model_path="", model_name="m",
                                       port=1, cards=cards, card_indexes=indexes))


def test_systemd_units_carry_the_cards_in_their_environment():
    argv = launch.start_argv("systemd", "llmgw-m-0", ["x"], "/opt/llmgw", env_of("llamacpp"))
    assert "--setenv=CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in argv
    assert "--setenv=CUDA_DEVICE_ORDER=PCI_BUS_ID" in argv
    assert argv.index("--collect") < argv.index("x")
    cpu = launch.start_argv("setsid", "llmgw-c-0", ["x"], "/opt/llmgw", env_of("llamacpp", (), ()))
    assert "CUDA_VISIBLE_DEVICES=" in cpu and cpu.index("CUDA_VISIBLE_DEVICES=") < cpu.index("setsid")
    assert not any(a.startswith("LLMGW_GPU_UUIDS") for a in cpu)


def test_vllm_and_sglang_get_card_numbers_in_bus_order_and_the_uuids_beside():
    for engine in ("vllm", "sglang"):
        env = env_of(engine)
        assert env == {"CUDA_VISIBLE_DEVICES": "5,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                       "LLMGW_GPU_UUIDS": "GPU-aaaa,GPU-bbbb"}


def serve(engine, **kw):
    base = dict(engine=engine, binary="/opt/bin/x", model_path="/srv/m", model_name="qwen", port=18001)
    return launch.engine_argv(launch.Serve(**base, **kw))


def test_llamacpp_offloads_every_layer_and_splits_only_on_a_cuda_build():
    argv = serve("llamacpp", cards=UUIDS, cuda=True, context=8192)
    assert argv[argv.index("-ngl") + 1] == "999"
    assert argv[argv.index("--tensor-split") + 1] == "1,1"
    assert argv[argv.index("--ctx-size") + 1] == "8192"
    assert "-ngl" not in serve("llamacpp", cards=UUIDS, cuda=False)
    assert "--tensor-split" not in serve("llamacpp", cards=UUIDS[:1], cuda=True)


def test_vllm_and_sglang_take_their_parallel_size_and_memory_share_from_the_claim():
    vllm = serve("vllm", cards=UUIDS, card_fraction=0.9, context=4096, args=("--enforce-eager",))
    assert vllm[:3] == ["/opt/bin/x", "serve", "/srv/m"]
    assert vllm[vllm.index("--served-model-name") + 1] == "qwen"
    assert vllm[vllm.index("--tensor-parallel-size") + 1] == "2"
    assert vllm[vllm.index("--gpu-memory-utilization") + 1] == "0.90"
    assert vllm[vllm.index("--max-model-len") + 1] == "4096" and vllm[-1] == "--enforce-eager"
    sg = serve("sglang", cards=UUIDS[:1], card_fraction=0.43)
    assert sg[:5] == ["/opt/bin/x", "-m", "sglang.launch_server", "--model-path", "/srv/m"]
    assert sg[sg.index("--tp") + 1] == "1" and sg[sg.index("--mem-fraction-static") + 1] == "0.43"
    assert sg[sg.index("--port") + 1] == "18001"


def test_each_engine_reads_its_api_key_from_the_file_and_no_argv_we_send_holds_it(tmp_path):
    import subprocess
    key_file = tmp_path / "llmgw-qwen-0.key"
    key_file.write_text("sk-engine-s3cret\n")
    show = tmp_path / "engine"  # stands in for each engine: prints what it was given
    show.write_text('#!/bin/sh\nprintf "%s\\n" "$@"; echo "VLLM_API_KEY=$VLLM_API_KEY"\n')
    show.chmod(0o755)
    for engine in ("llamacpp", "sim", "vllm", "sglang"):
        argv = serve(engine, key_file=str(key_file))
        assert not any("s3cret" in a for a in argv), (engine, argv)
        if engine == "sim":
            assert argv[-2:] == ["--api-key-file", str(key_file)]
            continue
        argv = [str(show) if a == "/opt/bin/x" else a for a in argv]
        got = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
        if engine == "llamacpp":
            assert got[-3:-1] == ["--api-key-file", str(key_file)] and got[-1] == "VLLM_API_KEY="
        elif engine == "vllm":
            assert "--api-key" not in got and got[-1] == "VLLM_API_KEY=sk-engine-s3cret"
        else:  # SGLang takes it on its command line only: the shell on the node puts it there
            assert got[-3:-1] == ["--api-key", "sk-engine-s3cret"]
    assert "--api-key-file" not in serve("llamacpp")  # a replica started without a key


def test_stopping_an_engine_removes_its_key_file(tmp_path):
    import subprocess
    run = tmp_path / "run"
    run.mkdir()
    (run / "llmgw-qwen-0.key").write_text("k")
    subprocess.run(launch.stop_argv("setsid", "llmgw-qwen-0", str(tmp_path)), check=True)
    assert not (run / "llmgw-qwen-0.key").exists()
    argv = launch.stop_argv("systemd", "llmgw-qwen-0", "/opt/llmgw")
    assert argv[-1] == "/opt/llmgw/run/llmgw-qwen-0.key" and 'rm -f "$1"' in argv[2]


def test_an_engine_whose_key_file_is_missing_or_empty_does_not_start(tmp_path):
    import subprocess
    show = tmp_path / "engine"
    show.write_text('#!/bin/sh\necho started\n')
    show.chmod(0o755)
    empty = tmp_path / "empty.key"
    empty.write_text("")
    for engine in ("vllm", "sglang"):
        for key_file in (empty, tmp_path / "missing.key"):
            argv = [str(show) if a == "/opt/bin/x" else a for a in serve(engine, key_file=str(key_file))]
            out = subprocess.run(argv, capture_output=True, text=True)
            assert out.returncode == 1 and "started" not in out.stdout, (engine, key_file, out)
            assert f"llmgw: no API key in {key_file}" in out.stderr


def test_a_node_listing_whose_tar_fails_refuses_the_archive(tmp_path):
    import subprocess
    from llmgw.facts import tarlist
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    out = subprocess.run(tarlist.listing_argv(str(junk), 10), capture_output=True, text=True)
    assert out.returncode == 0  # head's status: what tar said is in the listing itself
    refusals = archive.refusals(tarlist.parse_listing(out.stdout))
    assert refusals and any("llmgw: tar failed with status" in r for r in refusals), refusals
