"""Options: parsing, ini twins (command line wins), and UsageErrors that name the fix."""

from __future__ import annotations

import textwrap

import pytest

from pytest_specperf.plugin.options import OPTIONS

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


def test_defaults(pytester):
    pytester.makepyfile(SHOW)
    result = pytester.runpytest("-s")
    result.stdout.fnmatch_lines(["*SETTINGS reference 0.07 0.25 32 8 None () False baselines 32768"])


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
            "*--specperf-tolerance: invalid value 'abc'; expected a fraction*",
        ),
        (["--specperf-tolerance=150%"], "*--specperf-tolerance: invalid value '150%'*"),
        (["--specperf-tolerance=0"], "*--specperf-tolerance: invalid value '0'*"),
        (
            ["--specperf-steps=two"],
            "*--specperf-steps: invalid value 'two'; expected an integer in [[]4, *",
        ),
        (["--specperf-steps=2"], "*--specperf-steps: invalid value '2'*"),
        (["--specperf-warmup-steps=-1"], "*--specperf-warmup-steps: invalid value '-1'*"),
        (
            ["--specperf-device=../etc"],
            "*--specperf-device: invalid value '../etc'; expected a lowercase slug*",
        ),
        (["--specperf-device=NVIDIA H200"], "*--specperf-device: invalid value 'NVIDIA H200'*"),
        (
            ["--specperf-server-url=localhost:30000"],
            "*--specperf-server-url: server URL 'localhost:30000' must look like http://*",
        ),
        (["--specperf-server-url=http://127.0.0.1:99999"], "*invalid port*"),
        (
            ["--specperf-run-dir=/tmp"],
            "*--specperf-run-dir applies only with --specperf-server-url*",
        ),
        (
            ["--specperf-server-url=http://127.0.0.1:3", "--specperf-model=x"],
            "*attaches to a running server*",
        ),
        (["--specperf-server-arg="], "*--specperf-server-arg: invalid value ''*"),
        (["--specperf-processes=0"], "*--specperf-processes: invalid value '0'; expected an "
                                     "integer in [[]1, 16]*"),
        (["--specperf-keep-runs=65"], "*--specperf-keep-runs: invalid value '65'*"),
        (["--specperf-max-time=-1"], "*--specperf-max-time: invalid value '-1'; expected "
                                     "seconds in [[]0, 86400] (0: no automatic extension)*"),
        (["--specperf-history=/nonexistent/nightly"], "*--specperf-history: invalid value "
                                                      "'/nonexistent/nightly'; expected a directory*"),
        (
            ["--specperf-server-url=http://127.0.0.1:3", "--specperf-processes=2"],
            "*--specperf-processes 2 needs servers launched by the plugin*",
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


ATTACH_SHOW = """
def test_show(request):
    from pytest_specperf.plugin.session import get_session
    sess = get_session(request.config)
    s = sess.settings
    print("SETTINGS", s.server_url, s.model, s.server_args, s.processes)
    print("NOTES", *sess.notes)
"""


def test_attaching_from_the_command_line_ignores_the_ini_launch_settings(pytester):
    """A project's ini names its model for launched runs; --specperf-server-url on the
    command line attaches anyway, with a one-line note, instead of a usage error."""
    pytester.makeini(
        textwrap.dedent("""
        [pytest]
        specperf_model = medium
        specperf_server_args =
            --speculative-num-draft-tokens=16
        specperf_processes = 3
        """)
    )
    pytester.makepyfile(ATTACH_SHOW)
    result = pytester.runpytest("-s", "--specperf-server-url=http://127.0.0.1:30000")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*SETTINGS http://127.0.0.1:30000 None () 1",
        "NOTES attaching to http://127.0.0.1:30000: the ini file's launch settings "
        "(specperf_model, specperf_server_args, specperf_processes) are ignored (they apply "
        "when the plugin launches the server)",
    ])  # fmt: skip
    # on the command line they still conflict with attaching: a usage error naming them
    result = pytester.runpytest("--specperf-server-url=http://127.0.0.1:30000",
                                "--specperf-model=medium")  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--specperf-server-url attaches to a running server*"])
