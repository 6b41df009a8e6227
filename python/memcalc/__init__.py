"""memcalc: how much device memory one training step of a transformer language model takes.

The memcalc program, run in-process: each function builds its command line from keyword arguments,
runs it with ``--format json`` and returns the JSON it prints, as Python objects (exact ints). So the
results are the command-line program's, by construction.

Keyword arguments are the program's options (``memcalc --help``, ``memcalc fit --help``, ...):

* underscores become dashes: ``micro_batch=4`` is ``--micro-batch 4``;
* ``True`` is a flag (``sp=True`` is ``--sp``); ``False`` and ``None`` leave the option out;
* a list or tuple is a comma list, which sweeps: ``seq=[2048, 4096]`` is ``--seq 2048,4096``;
* a dict given for a file option (``config``, ``model_file``, ``recipe_file``, ``profile_file``,
  ``gpu_file``) is written to a temporary JSON file for the run, and removed afterwards; the model is
  named after a config's ``_name_or_path`` (its last part), else after the keyword (``config``).

``format`` and ``output`` are the module's own (a TypeError): :func:`run` gives a table, CSV or a file.

:func:`estimate`, :func:`fit`, :func:`plan` and :func:`serve` return typed results
(:mod:`memcalc.results`): dataclasses such as :class:`Estimate`, with ``r.peak.bytes`` and
``r.peak.step``, that are also the dicts of the program's JSON, every key as before. The catalogues
(:func:`presets`, ...) return lists of dicts.

Errors raise :class:`memcalc.Error` (a ``ValueError``) with the program's one-line message, without its
``memcalc:`` prefix; an unknown keyword is an unknown option, and gets the program's message for it.

>>> import memcalc
>>> r = memcalc.estimate(preset="llama-7b", seq=4096, recompute="selective")
>>> r.peak.bytes, r.peak.step
(116095778816, 'backward 32')
>>> r["peak"]["bytes"] == r.peak.bytes
True
"""

import json as _json
import os as _os
import re as _re
import shutil as _shutil
import tempfile as _tempfile
import typing as _t

from ._memcalc import run as _run_raw
from .results import (Activations, Estimate, Fit, FitResult, KvCache, Layout, ModelSummary,
                      Parameters, Peak, Plan, Result, Serve, ServeDevice, ServePeak, StagePeak,
                      TrainingState, Weights)

__all__ = ["Error", "run", "estimate", "fit", "plan", "serve", "rl", "presets", "recipes", "profiles",
           "gpus", "activation_functions", "arguments", "Result", "Estimate", "ModelSummary",
           "Parameters", "TrainingState", "Activations", "Peak", "StagePeak", "ServePeak", "Fit",
           "FitResult", "Serve", "Weights", "KvCache", "ServeDevice", "Plan", "Layout"]

_PREFIX = "memcalc: "


class Error(ValueError):
    """A run of memcalc that failed: its one-line message, without the ``memcalc:`` prefix.

    ``status`` is the program's exit status: 1 for bad input (a model, a file, sizes that overflow),
    2 for a bad command line (an unknown option, a bad value).

    >>> try:
    ...     memcalc.estimate(preset="no-such-model")
    ... except memcalc.Error as e:
    ...     print(e.status, e)
    1 unknown preset 'no-such-model'; 'memcalc presets' lists them
    """

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


def run(args):
    """Runs ``memcalc ARGS...`` in-process, as given: returns ``(status, out, err)``, the exit status
    and what the program prints on stdout and stderr. Nothing is raised for a failed run.

    >>> status, out, err = memcalc.run(["--preset", "gpt2", "--seq", "1024"])
    >>> status, err
    (0, '')
    >>> print(out)  # the table the program prints  # doctest: +SKIP
    """
    return _run_raw([_os.fspath(a) if isinstance(a, _os.PathLike) else str(a) for a in args])


def _value(value):
    if isinstance(value, (list, tuple)):
        return ",".join(_value(v) for v in value)
    if isinstance(value, _os.PathLike):
        return _os.fspath(value)
    return str(value)


def arguments(command=None, **options):
    """The command line (without the program's name) that a call with these keywords runs.

    >>> memcalc.arguments("fit", preset="llama-7b", gpu="h100-sxm", sp=True, seq=None, recompute=["none", "full"])
    ['fit', '--preset', 'llama-7b', '--gpu', 'h100-sxm', '--sp', '--recompute', 'none,full']
    """
    args = [command] if command else []
    for key, value in options.items():
        if value is None or value is False:
            continue
        option = "--" + key.replace("_", "-")
        if value is True:
            args.append(option)
        else:
            args += [option, _value(value)]
    return args


def _write_json_file(folder, key, value):
    """Writes a dict given for a file option where the program names the model after the file: a
    HuggingFace config's _name_or_path ("meta-llama/Llama-2-7b-hf": Llama-2-7b-hf), else the keyword."""
    stem = _re.sub(r"[^A-Za-z0-9._-]", "_", str(value.get("_name_or_path", "")).rstrip("/").split("/")[-1])
    stem = stem.strip(".") or key.replace("_", "-")
    # in a folder of the same name: ".../config/config.json" is the model "config", as a download's is
    path = _os.path.join(folder, stem, stem + ".json")
    _os.makedirs(_os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
        _json.dump(value, f)
    return path


def _json_command(command, options):
    for key in ("format", "output"):
        if key in options:
            raise TypeError(f"memcalc.{command or 'estimate'}() returns the JSON result: for --{key} use memcalc.run()")
    dicts = {key: value for key, value in options.items() if isinstance(value, dict)}
    written = {}
    folder = _tempfile.mkdtemp(prefix="memcalc-") if dicts else None
    try:
        for key, value in dicts.items():
            written[key] = options[key] = _write_json_file(_os.path.join(folder, key), key, value)
        status, out, err = run(arguments(command, **options) + ["--format", "json"])
    finally:
        if folder:
            _shutil.rmtree(folder, ignore_errors=True)
    if status != 0:
        message = err.strip().splitlines()[-1] if err.strip() else f"exit status {status}"
        if message.startswith(_PREFIX):
            message = message[len(_PREFIX):]
        for key, path in written.items():  # the file is gone: name the argument instead
            message = message.replace(path, f"<{key} dict>")
        raise Error(message, status)
    return _json.loads(out)


def _as(cls, result):
    """The JSON as ``cls`` (each item of a sweep's list)."""
    if isinstance(result, list):
        return [cls.from_json(r) for r in result]
    return cls.from_json(result)


def estimate(**options: _t.Any) -> _t.Union[Estimate, _t.List[Estimate]]:
    """The estimate for one model and run: parameters, training state, saved activations and the
    peak over the step's timeline, as ``memcalc [OPTIONS] --format json`` prints it.

    Choose the model with ``preset=``, ``model_file=`` (memcalc's JSON, a path or a dict) or
    ``config=`` (a HuggingFace config.json: a path, a model folder, or the dict itself). A list for
    ``seq``, ``micro_batch``, ``recompute``, ``dp``, ``tp``, ``pp`` or ``zero`` sweeps them.

    Returns an :class:`Estimate` (a list of them for a sweep): a dataclass with typed fields
    (``r.peak.bytes``, ``r.parameters.total``) that is also the program's JSON as a dict.

    >>> r = memcalc.estimate(preset="llama-7b", seq=4096, recompute="selective")
    >>> r.parameters.total, r["parameters"]["total"]
    (6738415616, 6738415616)
    >>> [r.peak.bytes for r in memcalc.estimate(preset="llama-7b", seq=[2048, 4096], tp=2, sp=True)]
    [62742134784, 99771539456]
    >>> config = json.load(open("Llama-2-7b-hf/config.json"))  # doctest: +SKIP
    >>> memcalc.estimate(config=config, seq=4096)["model"]["name"]  # doctest: +SKIP
    'Llama-2-7b-hf'
    """
    return _as(Estimate, _json_command(None, options))


def fit(**options: _t.Any) -> Fit:
    """The longest sequence (or, with ``seq=``, the largest micro-batch) that fits in a device's memory,
    for each recomputation mode: ``memcalc fit [OPTIONS] --format json``.

    >>> r = memcalc.fit(preset="llama-3-8b", train="lora", gpu="h100-sxm", recompute="selective")
    >>> r.search, r.results[0].largest
    ('seq', 6535)
    """
    return _as(Fit, _json_command("fit", options))


def plan(**options: _t.Any) -> Plan:
    """The layouts of a cluster that fit, ranked by estimated step time (or the fewest GPUs on which one
    fits): ``memcalc plan [OPTIONS] --format json``. ``global_batch=`` is required.

    >>> r = memcalc.plan(preset="llama-7b", seq=4096, global_batch=64, gpus=8, gpu="h100-sxm")
    >>> {key: r["layouts"][0][key] for key in ("dp", "tp", "pp", "zero", "recompute")}
    {'dp': 2, 'tp': 1, 'pp': 1, 'zero': 1, 'recompute': 'none'}
    """
    return _as(Plan, _json_command("plan", options))


def serve(**options: _t.Any) -> Serve:
    """Inference memory: the weights and the KV cache for a context and batch,
    ``memcalc serve [OPTIONS] --format json``.

    >>> r = memcalc.serve(preset="llama-3-8b", context=8192, batch=4, gpu="h100-sxm")
    >>> r.kv_cache.bytes, r.peak.bytes, r.device.fits
    (4294967296, 21197428736, True)
    """
    return _as(Serve, _json_command("serve", options))


def rl(**options: _t.Any) -> dict:
    """A post-training job (GRPO, PPO, RLOO, DPO, KTO, ORPO) on one device: its roles, rollouts and
    phases, each phase's peak and the job's, named: ``memcalc rl [OPTIONS] --format json``, as a dict.

    >>> r = memcalc.rl(algorithm="dpo", preset="qwen2-0.5b", gpu="a100-80gb")
    >>> [role["role"] for role in r["roles"]], r["peak"]["phase"], r["device"]["fits"]
    (['policy', 'reference'], 'reference forward in the step', True)
    """
    return _json_command("rl", options)


def presets():
    """The built-in models: a list of dicts (name, description, parameters, source, ...).

    >>> [p["name"] for p in memcalc.presets()][:3]
    ['bloom-560m', 'bloom-7b1', 'decoder']
    """
    return _json_command("presets", {})


def recipes():
    """The built-in training recipes (bytes per parameter and dtypes), as dicts.

    >>> "mixed-adam" in [r["name"] for r in memcalc.recipes()]
    True
    """
    return _json_command("recipes", {})


def profiles():
    """The built-in framework profiles (attention kernel, optimiser implementation, ...), as dicts.

    >>> "default" in [p["name"] for p in memcalc.profiles()]
    True
    """
    return _json_command("profiles", {})


def gpus():
    """The built-in GPUs (memory as the driver reports it, speeds), as dicts.

    >>> "h100-sxm" in [g["name"] for g in memcalc.gpus()]
    True
    """
    return _json_command("gpus", {})


def activation_functions():
    """The activation functions memcalc knows, as dicts.

    >>> len(memcalc.activation_functions()) > 0
    True
    """
    return _json_command("activation-functions", {})
