"""Options: parsing, ini twins (command line wins), and UsageErrors that name the fix."""

from __future__ import annotations

import textwrap

import pytest

from pytest_specperf.plugin.options import OPTIONS, REPLACED_FLAGS, REPLACED_INI

SHOW = """
def test_show(request):
    from pytest_specperf.plugin.session import get_session
    s = get_session(request.config).settings
    print("SETTINGS", s.backend, s.tolerance, s.step_tolerance, s.steps, s.warmup_steps, s.device_slug,
          s.server_args, s.update_baselines, s.baselines_dir.name, s.long_context_min)
"""


def test_every_option_is_listed_in_help(pytester):
    result = pytester.runpytest("--help")
    for o in OPTIONS:
        result.stdout.fnmatch_lines([f"*{o.flag}*" if o.kind != "ini" else f"*{o.ini}*"])
    result.stdout.fnmatch_lines(["*specperf_tolerance*", "*specperf_long_context_min*"])
    for old in REPLACED_FLAGS:
        result.stdout.no_fnmatch_line(f"*{old}*")


def test_help_of_the_group_fits_on_a_screen(pytester, monkeypatch):
    """At most 20 flags, one idea each, and the group's help at most 40 lines wide 80."""
    monkeypatch.setenv("COLUMNS", "80")
    lines = pytester.runpytest("--help").stdout.lines
    start = lines.index("speculative-decoding performance (pytest-specperf):")
    group = lines[start : lines.index("", start)]
    assert len([o for o in OPTIONS if o.kind != "ini"]) <= 20
    assert len(group) <= 40, "\n".join(group)


def test_defaults(pytester):
    pytester.makepyfile(SHOW)
    result = pytester.runpytest("-s")
    result.stdout.fnmatch_lines(
        ["*SETTINGS reference 0.07 0.25 32 8 None () False baselines 32768"]
    )


STEPS_TOLERANCE = """
def test_show(request):
    from pytest_specperf.plugin.session import get_session
    s = get_session(request.config).settings
    print("PARTS", s.tolerance, s.step_tolerance, s.steps, s.warmup_steps)
"""


def test_parts_of_a_value_merge_command_line_over_ini(pytester):
    """tolerance and steps: a part the command line leaves out comes from the ini file, then
    from the default."""
    pytester.makepyfile(STEPS_TOLERANCE)
    pytester.runpytest("-s", "--specperf-tolerance=step=40%", "--specperf-steps=warmup=0"
                       ).stdout.fnmatch_lines(["*PARTS 0.07 0.4 32 0"])  # fmt: skip
    pytester.makeini("[pytest]\nspecperf_tolerance = 5%,step=30%\nspecperf_steps = 16,warmup=4\n")
    pytester.runpytest("-s").stdout.fnmatch_lines(["*PARTS 0.05 0.3 16 4"])
    pytester.runpytest("-s", "--specperf-tolerance=10%", "--specperf-steps=warmup=1"
                       ).stdout.fnmatch_lines(["*PARTS 0.1 0.3 16 1"])  # fmt: skip
    pytester.runpytest("-s", "--specperf-tolerance=phase=2%,step=50%", "--specperf-steps=8"
                       ).stdout.fnmatch_lines(["*PARTS 0.02 0.5 8 4"])  # fmt: skip


def test_ini_twins_and_command_line_wins(pytester):
    pytester.makeini(
        textwrap.dedent("""
        [pytest]
        specperf_tolerance = 12%
        specperf_steps = 16
        specperf_device = my-box
        specperf_update_baselines = true
        specperf_long_context_min = 1000
        specperf_server_args =
            --page-size=32
            --threads=1
    """)
    )
    pytester.makepyfile(SHOW)
    result = pytester.runpytest("-s")
    result.stdout.fnmatch_lines(
        [
            "*SETTINGS reference 0.12 0.25 16 8 my-box ('--page-size=32', '--threads=1') True baselines 1000"
        ]
    )
    result = pytester.runpytest(
        "-s",
        "--specperf-tolerance=0.05",
        "--specperf-steps=40",
        "--specperf-device=other",
        "--specperf-server-arg=--x=1",
    )
    result.stdout.fnmatch_lines(
        ["*SETTINGS reference 0.05 0.25 40 8 other ('--x=1',) True baselines 1000"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--specperf-backend=vllm"],
            "*--specperf-backend: invalid value 'vllm'; expected one of: reference, sglang*",
        ),
        (
            ["--specperf-tolerance=abc"],
            "*argument --specperf-tolerance: invalid value 'abc': phase 'abc' is not a fraction "
            "in (0, 1); expected PHASE[[],step=STEP[]]*",
        ),
        (["--specperf-tolerance=150%"], "*--specperf-tolerance: invalid value '150%'*"),
        (["--specperf-tolerance=0"], "*--specperf-tolerance: invalid value '0'*"),
        (
            ["--specperf-tolerance=7%,steps=25%"],
            "*--specperf-tolerance: invalid value '7%,steps=25%': unknown part 'steps' (known: "
            "phase, step)*",
        ),
        (
            ["--specperf-steps=two"],
            "*--specperf-steps: invalid value 'two': steps 'two' is not an integer; expected "
            "N[[],warmup=W[]]*",
        ),
        (["--specperf-steps=2"], "*--specperf-steps: invalid value '2': steps 2 is not in [[]4, *"),
        (["--specperf-steps=8,warmup=-1"], "*--specperf-steps: invalid value '8,warmup=-1'*"),
        (
            ["--specperf-device=../etc"],
            "*--specperf-device: invalid value '../etc'; expected a lowercase slug*",
        ),
        (["--specperf-device=NVIDIA H200"], "*--specperf-device: invalid value 'NVIDIA H200'*"),
        (
            ["--specperf-attach=localhost:30000"],
            "*--specperf-attach: invalid value 'localhost:30000': server URL 'localhost:30000' "
            "must look like http://*",
        ),
        (["--specperf-attach=http://127.0.0.1:99999"], "*invalid port*"),
        (
            ["--specperf-attach=http://127.0.0.1:3,rundir=/tmp"],
            "*--specperf-attach: invalid value 'http://127.0.0.1:3,rundir=/tmp': unknown part "
            "'rundir' (known: run-dir)*",
        ),
        (
            ["--specperf-attach=http://127.0.0.1:3", "--specperf-model=x"],
            "*--specperf-attach measures a running server, and --specperf-model only configures "
            "a server the plugin launches: drop it or drop --specperf-attach*",
        ),
        (
            ["--specperf-attach=http://127.0.0.1:3", "--specperf-profile=nvtx"],
            "*--specperf-profile only configures a server the plugin launches*SPECPERF_NVTX=1*",
        ),
        (["--specperf-server-arg="], "*--specperf-server-arg: invalid value ''*"),
        (
            ["--specperf-processes=0"],
            "*--specperf-processes: invalid value '0': processes 0 is not in [[]1, 16]*",
        ),
        (
            ["--specperf-max-time=-1"],
            "*--specperf-max-time: invalid value '-1': out of range; "
            "expected seconds in [[]0, 86400] (0: no automatic extension)*",
        ),
        (
            ["--specperf-history=/nonexistent/nightly"],
            "*--specperf-history: invalid value '/nonexistent/nightly'; expected a directory*",
        ),
        (
            ["--specperf-attach=http://127.0.0.1:3", "--specperf-processes=2"],
            "*--specperf-processes only configures a server the plugin launches*",
        ),
        (
            ["--specperf-profile=nvtx,kernels"],
            "*--specperf-profile: invalid value 'nvtx,kernels': kernels needs a number, e.g. "
            "kernels=16*",
        ),
        (
            ["--specperf-profile=nvtx,flame"],
            "*unknown part 'flame' (known: nvtx, kernels, on-regression, none)*",
        ),
        (
            ["--specperf-budget=max_step_ms"],
            "*--specperf-budget: invalid value 'max_step_ms': max_step_ms has no limit*",
        ),
    ],
)
def test_bad_values_are_usage_errors(pytester, args, message):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_ini_value_names_the_ini_option(pytester):
    pytester.makeini("[pytest]\nspecperf_backend = tgi\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini option specperf_backend: invalid value 'tgi'*"])


def test_baselines_path_that_is_a_file(pytester):
    pytester.makefile(".yaml", baselines="x: 1")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--specperf-baselines=baselines.yaml")
    result.stderr.fnmatch_lines(
        ["*--specperf-baselines: invalid value 'baselines.yaml'; expected a directory*"]
    )


def test_plugin_can_be_disabled(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:specperf", "--specperf-steps=8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --specperf-steps=8*"])
    assert pytester.runpytest("-p", "no:specperf").ret == 0


def test_loads_and_lists_options_without_torch(pytester, monkeypatch):
    """A machine without torch: the plugin loads and --help lists its options."""
    blocker = pytester.mkpydir("torch")
    (blocker / "__init__.py").write_text("raise ImportError('torch is not installed here')\n")
    pytester.makepyfile("""
        import sys
        def test_no_torch_loaded():
            assert 'torch' not in sys.modules
    """)
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--specperf-backend=NAME*"])
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


NOISE = """
def test_show(request):
    from pytest_specperf.plugin.session import get_session
    s = get_session(request.config).settings
    print("NOISE", s.processes, s.keep_runs, s.max_time_s, s.history_dir and s.history_dir.name)
"""


@pytest.mark.parametrize("flag", sorted(REPLACED_FLAGS))
def test_old_flags_are_refused_naming_the_new_spelling(pytester, flag):
    new, takes_value = REPLACED_FLAGS[flag]
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(f"{flag}=1" if takes_value else flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*argument {flag}: was replaced by {new.replace('[', '[[]')}"])


def test_the_old_tolerance_spellings_name_the_new_one(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--specperf-step-tolerance", "25%")
    result.stderr.fnmatch_lines(
        ["*--specperf-step-tolerance: was replaced by --specperf-tolerance PHASE,step=STEP*"]
    )
    result = pytester.runpytest("--specperf-server-url=http://127.0.0.1:3")
    result.stderr.fnmatch_lines(["*--specperf-server-url: was replaced by --specperf-attach URL"])


@pytest.mark.parametrize("flag", ["--specperf-keep-runs", "--specperf-baseline-max-mb",
                                  "--specperf-ready-timeout"])  # fmt: skip
def test_flags_that_became_ini_only_say_how_to_set_them(pytester, flag):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(f"{flag}=3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    ini = "specperf_" + flag.removeprefix("--specperf-").replace("-", "_")
    result.stderr.fnmatch_lines([f"*argument {flag}: is ini-only now: -o {ini}=*, or {ini} in the "
                                 "ini file"])  # fmt: skip


@pytest.mark.parametrize("name", sorted(REPLACED_INI))
def test_old_ini_options_are_refused_naming_the_new_one(pytester, name):
    pytester.makeini(f"[pytest]\n{name} = 1\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    new = REPLACED_INI[name].replace("[", "[[]")
    result.stderr.fnmatch_lines([f"*ini option {name} was replaced by {new}"])


ATTACH = """
def test_show(request):
    from pytest_specperf.plugin.session import get_session
    s = get_session(request.config).settings
    print("ATTACH", s.server_url, s.run_dir, s.model, s.server_args, s.processes, s.nvtx,
          s.kernel_every, s.profile_on_regression, s.notes)
"""
LAUNCH_INI = """[pytest]
specperf_model = tiny
specperf_server_args = --page-size=16
specperf_processes = 3
specperf_profile = nvtx,kernels=4,on-regression
"""


def test_attaching_from_the_command_line_ignores_ini_launch_settings_with_a_note(pytester):
    """Issue 30: the ini file's launch settings need not be blanked to attach."""
    pytester.makeini(LAUNCH_INI)
    pytester.makepyfile(ATTACH)
    result = pytester.runpytest("-s", "--specperf-attach=http://127.0.0.1:3,run-dir=rd")
    result.stdout.fnmatch_lines([
        "*ATTACH http://127.0.0.1:3 rd None () 1 False None True (\"attached with "
        "--specperf-attach: ignored the ini file's launch settings (specperf_model, "
        "specperf_server_args, specperf_processes, specperf_profile's nvtx and kernels)\",)"
    ])  # fmt: skip
    # without attaching they apply
    pytester.runpytest("-s").stdout.fnmatch_lines(
        ["*ATTACH None None tiny ('--page-size=16',) 3 True 4 True ()"]
    )


def test_attaching_from_the_ini_file_with_launch_settings_is_refused(pytester):
    pytester.makeini(LAUNCH_INI + "specperf_attach = http://127.0.0.1:3\n")
    pytester.makepyfile(ATTACH)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*ini option specperf_attach measures a running server, and ini option specperf_model, "
        "ini option specperf_server_args, ini option specperf_processes, ini option "
        "specperf_profile only configure a server the plugin launches: drop them or drop ini "
        "option specperf_attach*"
    ])  # fmt: skip


BUDGETS = """
def test_show(request):
    from pytest_specperf.plugin.session import get_session
    print("BUDGETS", get_session(request.config).settings.budgets())
"""


def test_budgets_repeat_and_merge_by_name_over_the_ini_file(pytester):
    pytester.makeini("[pytest]\nspecperf_budgets =\n    max_step_ms=250\n    min_accept_len=2\n")
    pytester.makepyfile(BUDGETS)
    result = pytester.runpytest(
        "-s", "--specperf-budget=max_step_ms=100,min_active_share=50%",
        "--specperf-budget=min_tokens_per_s=20",
    )  # fmt: skip
    result.stdout.fnmatch_lines([
        "*BUDGETS Budgets(max_unaccounted_share=None, min_active_share=0.5, max_step_ms=100.0, "
        "min_accept_len=2.0, min_tokens_per_s=20.0)"
    ])  # fmt: skip


def test_noise_options_and_their_ini_twins(pytester):
    pytester.makepyfile(NOISE)
    pytester.mkdir("nightly")
    result = pytester.runpytest("-s")
    result.stdout.fnmatch_lines(["*NOISE 1 5 30.0 None"])
    pytester.makeini(
        "[pytest]\nspecperf_processes = 3\nspecperf_keep_runs = 8\nspecperf_max_time = 0\n"
        "specperf_history = nightly\n"
    )
    result = pytester.runpytest("-s")
    result.stdout.fnmatch_lines(["*NOISE 3 8 0.0 nightly"])
    result = pytester.runpytest("-s", "--specperf-processes=2", "--specperf-max-time=45")
    result.stdout.fnmatch_lines(["*NOISE 2 8 45.0 nightly"])


def test_readme_options_table_lists_every_option():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("## Options", 1)[1].split("\n## ", 1)[0]
    for o in OPTIONS:
        if o.kind != "ini":
            assert f"| `{o.flag}" in table, o.flag
        assert f"| `{o.ini}` |" in table or f"`{o.ini}` (" in table, o.ini


def test_help_texts_have_no_restructuredtext_backticks(pytester, capsys):
    from pytest_specperf.__main__ import main

    result = pytester.runpytest("--help")
    ours = [line for line in result.stdout.lines if "specperf" in line]
    assert ours and not any("``" in line for line in ours)
    capsys.readouterr()  # pytester's run printed pytest's own help (which has some)
    for argv in ([], ["calibrate"], ["sglang-check"], ["history"], ["compare"]):
        argv = [*argv, "--help"]
        with pytest.raises(SystemExit):
            main(argv)
        text = capsys.readouterr().out
        assert "specperf" in text and "``" not in text, argv


def test_strict_and_markdown_have_ini_twins(pytester):
    pytester.makeini("[pytest]\nspecperf_strict = true\nspecperf_markdown = out/s.md\n")
    pytester.makepyfile("""
        def test_show(request):
            from pytest_specperf.plugin.session import get_session
            s = get_session(request.config).settings
            print("STRICT", s.strict, s.markdown_path.name)
    """)
    pytester.runpytest("-s").stdout.fnmatch_lines(["*STRICT True s.md*"])
