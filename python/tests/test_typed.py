"""The typed results (memcalc.results): dataclasses with the JSON's values as typed attributes, that
are still the program's JSON as dicts."""
import copy
import dataclasses
import json
import pickle
import pydoc

import memcalc
from memcalc import results


def fields_are_keys(result):
    """Every field of a result (and of the results it holds) is a key of its JSON, with its value."""
    assert dataclasses.is_dataclass(result) and isinstance(result, dict)
    for field in dataclasses.fields(result):
        assert field.name in result, f"{type(result).__name__}.{field.name}"
        value = getattr(result, field.name)
        if isinstance(value, results.Result):
            assert value == result[field.name]
            fields_are_keys(value)
        elif isinstance(value, list) and value and isinstance(value[0], results.Result):
            assert value == result[field.name]
            for item in value:
                fields_are_keys(item)
        else:
            assert value == result[field.name], f"{type(result).__name__}.{field.name}"


def test_estimate_is_typed_and_the_programs_json(program):
    args = ["--preset", "llama-7b", "--seq", "4096", "--recompute", "selective", "--gpu", "h100-sxm"]
    r = memcalc.estimate(preset="llama-7b", seq=4096, recompute="selective", gpu="h100-sxm")
    raw = program.json(args)
    assert isinstance(r, memcalc.Estimate) and r == raw
    assert json.loads(json.dumps(r)) == raw
    assert (r.peak.bytes, r.peak.step, r.peak.fits) == (raw["peak"]["bytes"], raw["peak"]["step"],
                                                        raw["peak"]["fits"])
    assert isinstance(r.peak, memcalc.Peak) and isinstance(r.parameters, memcalc.Parameters)
    assert r.parameters.total == raw["parameters"]["total"]
    assert r.model.name == "llama-7b" and r.state.bytes == raw["state"]["bytes"]
    fields_are_keys(r)


def test_a_sweep_is_a_list_of_estimates(program):
    sweep = memcalc.estimate(preset="gpt2", seq=[512, 1024], recompute=["none", "full"])
    raw = program.json(["--preset", "gpt2", "--seq", "512,1024", "--recompute", "none,full"])
    assert len(sweep) == len(raw) == 4 and sweep == raw
    assert all(isinstance(r, memcalc.Estimate) for r in sweep)
    assert [r.peak.bytes for r in sweep] == [r["peak"]["bytes"] for r in raw]


def test_fit_serve_plan_are_typed(program):
    fit = memcalc.fit(preset="gpt2", device_memory="8GB", recompute=["none", "full"])
    assert isinstance(fit, memcalc.Fit) and isinstance(fit.results[0], memcalc.FitResult)
    assert fit.results[0].largest == fit["results"][0]["largest"]
    fields_are_keys(fit)
    serve = memcalc.serve(preset="llama-3-8b", context=8192, batch=4, gpu="h100-sxm")
    assert isinstance(serve.device, memcalc.ServeDevice) and serve.device.fits is True
    assert serve.kv_cache.bytes == serve["kv_cache"]["bytes"]
    assert serve.peak.bytes < serve.peak.reserved_bytes < serve.peak.device_bytes
    fields_are_keys(serve)
    plan = memcalc.plan(preset="gpt2", seq=1024, global_batch=8, gpus=2, device_memory="80GB", top=2)
    assert isinstance(plan.layouts[0], memcalc.Layout) and plan.layouts[0].rank == 1
    assert plan.layouts[0].peak.bytes == plan["layouts"][0]["peak"]["bytes"]
    fields_are_keys(plan)


def test_copies_and_help():
    r = memcalc.estimate(preset="gpt2", seq=1024)
    for other in (copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert type(other) is memcalc.Estimate and other == r and other.peak.bytes == r.peak.bytes
    page = pydoc.render_doc(memcalc.Estimate, renderer=pydoc.plaintext)
    assert "r.peak.bytes" in page and "peak: memcalc.results.Peak" in page
    assert "Estimate" in pydoc.render_doc(memcalc.estimate, renderer=pydoc.plaintext)
    assert repr(r).startswith("Estimate(memcalc=") and "Peak(bytes=" in repr(r)
