"""memcalc's Python module gives the program's JSON, for every preset and a sweep of settings, and its errors."""
import json
import os
import signal
import tempfile
import threading

import pytest

import memcalc

# (function, keywords): each is compared with the program run on the same command line.
SETTINGS = [
    ("estimate", dict(preset="llama-7b", seq=4096, recompute="selective")),
    ("estimate", dict(preset="llama-7b", seq=4096, recompute="full", timeline=True)),
    ("estimate", dict(preset="llama-7b", seq=4096, recompute="all")),
    ("estimate", dict(preset="llama-7b", seq=[1024, 2048, 4096], recompute=("none", "selective", "full"))),
    ("estimate", dict(preset="gpt2", seq=1024, micro_batch=[1, 2, 8], units="gib")),
    ("estimate", dict(preset="llama-2-70b", seq=4096, tp=8, sp=True, pp=4, dp=2, zero=1, global_batch=128,
                      recompute="selective")),
    ("estimate", dict(preset="llama-3.1-405b", seq=8192, tp=8, pp=16, dp=8, zero=1, first_stage_layers=7,
                      last_stage_layers=7)),
    ("estimate", dict(preset="mixtral-8x7b", seq=4096, tp=2, ep=4, dp=8, zero=[1, 3])),
    ("estimate", dict(preset="llama-7b", seq=4096, activations="architecture", profile="megatron",
                      recipe="mixed-adam-fp32-grads")),
    ("estimate", dict(preset="llama-3-8b", seq=8192, activations="architecture", attention="flash", recompute="op")),
    ("estimate", dict(preset="llama-7b", seq=2048, train="lora", lora_rank=8, lora_targets=["q_proj", "v_proj"])),
    ("estimate", dict(preset="llama-3-8b", seq=2048, train="qlora", lora_rank=16, lora_targets="all-linear",
                      recompute="full")),
    ("estimate", dict(preset="llama-7b", seq=2048, train="frozen", frozen="embeddings,attention")),
    ("estimate", dict(preset="llama-7b", seq=4096, compare="megatron", gpu="h100-sxm", sp=False, cp=None)),
    ("fit", dict(preset="llama-7b", gpu="h100-sxm", recompute="selective")),
    ("fit", dict(preset="llama-3-70b", train="qlora", lora_targets="all-linear", recompute="full",
                 device_memory="48GB")),
    ("fit", dict(preset="llama-2-70b", device_memory="80GB", tp=8, sp=True, dp=8, zero=1, multiple_of=1024)),
    ("plan", dict(preset="llama-7b", seq=4096, global_batch=64, gpus=8, gpu="h100-sxm", top=3)),
    ("serve", dict(preset="llama-3-70b", context=32768, batch=8, tp=8, gpu="h100-sxm")),
    ("serve", dict(preset="llama-3-8b", context=8192, weights="int4", kv_dtype="fp8", device_memory="24GB")),
]


@pytest.mark.parametrize("function,options", SETTINGS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(SETTINGS)])
def test_settings_give_the_programs_json(program, function, options):
    command = None if function == "estimate" else function
    args = memcalc.arguments(command, **options)
    assert untimed(getattr(memcalc, function)(**options)) == untimed(program.json(args))
    if function != "plan":  # the very text, too: one program, printing into a string instead of stdout
        assert memcalc.run([*args, "--format", "json"]) == program.run([*args, "--format", "json"])


def untimed(result):
    """plan's result without the search's own run time."""
    if isinstance(result, dict):
        result.pop("seconds", None)
    return result


def test_every_preset(program, preset):
    assert memcalc.estimate(preset=preset) == program.json(["--preset", preset])
    options = dict(preset=preset, recompute="all", micro_batch=[1, 2], activations="architecture")
    assert memcalc.estimate(**options) == program.json(memcalc.arguments(**options))
    options = dict(preset=preset, gpu="h100-sxm", recompute="selective")
    assert memcalc.fit(**options) == program.json(memcalc.arguments("fit", **options))


@pytest.mark.parametrize("name", ["presets", "recipes", "profiles", "gpus", "activation_functions"])
def test_catalogues(program, name):
    assert getattr(memcalc, name)() == program.json([name.replace("_", "-")])


def test_exact_ints():
    r = memcalc.estimate(preset="llama-3.1-405b", seq=131072, micro_batch=64)
    ints = []

    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, int) and not isinstance(v, bool):
            ints.append(v)
    walk(r)
    assert max(ints) > 2 ** 53  # past a double's exact range, still exact


def test_keywords_to_options():
    assert memcalc.arguments("fit", preset="llama-7b", micro_batch=2, sp=True, cp=None, timeline=False,
                             recompute=["none", "full"], seq=(1024, 2048)) == [
        "fit", "--preset", "llama-7b", "--micro-batch", "2", "--sp", "--recompute", "none,full", "--seq", "1024,2048"]


def expect_error(program, args, call):
    status, out, err = program.run([*args, "--format", "json"])
    assert status != 0 and out == ""
    with pytest.raises(memcalc.Error) as caught:
        call()
    assert caught.value.status == status
    assert "memcalc: " + str(caught.value) == err.strip()
    assert isinstance(caught.value, ValueError)
    return caught.value


def test_errors_carry_the_programs_message(program):
    e = expect_error(program, ["--preset", "no-such-model"], lambda: memcalc.estimate(preset="no-such-model"))
    assert e.status == 1 and str(e).startswith("unknown preset 'no-such-model'")
    # an unknown keyword is an unknown option, with the program's message for it
    e = expect_error(program, ["--preset", "gpt2", "--no-such-option", "1"],
                     lambda: memcalc.estimate(preset="gpt2", no_such_option=1))
    assert e.status == 2 and "--no-such-option" in str(e)
    expect_error(program, ["--preset", "gpt2", "--seq", "many"], lambda: memcalc.estimate(preset="gpt2", seq="many"))
    expect_error(program, ["fit", "--preset", "gpt2"], lambda: memcalc.fit(preset="gpt2"))
    expect_error(program, ["serve", "--preset", "gpt2"], lambda: memcalc.serve(preset="gpt2"))
    expect_error(program, ["--preset", "gpt2", "--config", "x.json"], lambda: memcalc.estimate(preset="gpt2", config="x.json"))
    expect_error(program, ["--config", "/no/such/config.json"], lambda: memcalc.estimate(config="/no/such/config.json"))


def test_format_and_output_are_the_modules(tmp_path):
    with pytest.raises(TypeError):
        memcalc.estimate(preset="gpt2", format="table")
    with pytest.raises(TypeError):
        memcalc.estimate(preset="gpt2", output=str(tmp_path / "x.json"))


def test_config_as_path_and_as_dict(program, source_dir, tmp_path, monkeypatch):
    path = os.path.join(source_dir, "tests", "configs", "llama-2-7b.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the dict's file goes
    expected = program.json(["--config", path, "--seq", "4096", "--recompute", "all"])
    from_path = memcalc.estimate(config=path, seq=4096, recompute="all")
    # the model is named after _name_or_path's last part, as the program names it after the file
    from_dict = memcalc.estimate(config=dict(config, _name_or_path="meta-llama/llama-2-7b"), seq=4096, recompute="all")
    assert from_path == expected
    assert from_dict == expected
    assert list(tmp_path.iterdir()) == []  # the dict's file is removed
    assert memcalc.estimate(config=config, seq=4096)["model"]["name"] == config["_name_or_path"].split("/")[-1]
    del config["_name_or_path"]
    assert memcalc.estimate(config=config, seq=4096)["model"]["name"] == "config"  # else the keyword
    # an error names the argument, not the removed file
    del config["hidden_size"]
    with pytest.raises(memcalc.Error, match=r"^<config dict>: .*hidden_size"):
        memcalc.estimate(config=config, seq=4096)
    assert list(tmp_path.iterdir()) == []


def test_model_file_as_path_and_as_dict(program, source_dir):
    path = os.path.join(source_dir, "presets", "llama-7b.json")
    with open(path, encoding="utf-8") as f:
        model = json.load(f)
    expected = program.json(["--model-file", path, "--seq", "4096", "--tp", "2"])
    assert memcalc.estimate(model_file=path, seq=4096, tp=2) == expected
    from_dict = memcalc.estimate(model_file=model, seq=4096, tp=2)
    assert from_dict == expected


def test_python_keeps_its_signal_handlers(tmp_path):
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    plot = tmp_path / "timeline.svg"
    memcalc.estimate(preset="gpt2", seq=1024, plot=plot)  # --plot installs the program's handlers
    assert plot.read_text().startswith("<")
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == before


def test_threads():
    expected = memcalc.estimate(preset="llama-7b", seq=4096)
    results = []
    threads = [threading.Thread(target=lambda: results.append(memcalc.estimate(preset="llama-7b", seq=4096)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4
