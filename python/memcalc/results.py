"""Typed results: the program's JSON as dataclasses that are still the dicts they were.

Each result is a ``dict`` holding every key of the JSON the program prints, unchanged (so
``r["peak"]["bytes"]``, ``json.dumps(r)`` and ``r == json.loads(out)`` work as before), and a
dataclass whose fields are the keys most questions need, typed (so ``r.peak.bytes`` and
``help(memcalc.Estimate)`` work). A field that is itself a result class is made from its key's
dict (or list of dicts); the others are the JSON's values as they are.

Why both in one object rather than a ``typed=`` choice: no call site has to change, nothing that
read the dicts breaks, and the typed attributes are there for whoever wants them.
"""

import dataclasses as _dc
import typing as _t

__all__ = ["Result", "Estimate", "ModelSummary", "Parameters", "TrainingState", "Activations",
           "Peak", "StagePeak", "ServePeak", "Fit", "FitResult", "Serve", "Weights", "KvCache",
           "ServeDevice", "Plan", "Layout"]

_R = _t.TypeVar("_R", bound="Result")


class Result(dict):
    """A JSON object from memcalc, as a dict, with some of its keys as typed attributes."""

    @classmethod
    def from_json(cls: _t.Type[_R], raw: _t.Mapping[str, _t.Any]) -> _R:
        """The result for ``raw`` (the program's JSON object): its fields from raw's keys."""
        hints = _t.get_type_hints(cls)
        values = {f.name: _typed(hints[f.name], raw.get(f.name)) for f in _dc.fields(cls)}
        result = cls(**values)
        dict.update(result, raw)
        return result

    def __reduce__(self):  # copy and pickle: made again from the JSON
        return (type(self).from_json, (dict(self),))

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in _dc.fields(self))
        return f"{type(self).__name__}({fields})"


def _typed(hint, value):
    """``value`` as ``hint`` says: a Result made from a dict, a list of them, or as it is."""
    if value is None:
        return None
    origin, args = getattr(hint, "__origin__", None), getattr(hint, "__args__", ())
    if origin is _t.Union:  # Optional[X]
        return _typed(next(a for a in args if a is not type(None)), value)
    if origin is list and args and isinstance(value, list):
        return [_typed(args[0], v) for v in value]
    if isinstance(hint, type) and issubclass(hint, Result) and isinstance(value, dict):
        return hint.from_json(value)
    return value


def _result(cls):
    """A dataclass that compares, hashes and prints as the dict it also is."""
    return _dc.dataclass(eq=False, repr=False)(cls)


@_result
class ModelSummary(Result):
    """The model an estimate is for (``r["model"]`` holds every field of its architecture)."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int


@_result
class Parameters(Result):
    """Parameter counts: ``total`` every parameter, ``trainable`` those that train."""
    total: int
    trainable: int
    embedding: int
    head: int
    layers: int


@_result
class TrainingState(Result):
    """Weights, gradients, master copy and optimiser state, in bytes (``bytes`` their sum)."""
    bytes: int
    bytes_per_parameter: _t.Optional[int]
    weights: int
    gradients: int
    master_weights: int
    optimizer_state: int


@_result
class Activations(Result):
    """The saved activations: ``bytes`` for every layer, ``layer_bytes`` for one, in bytes."""
    bytes: int
    layer_bytes: int
    model: str
    attention: str
    formula: _t.Optional[str]


@_result
class Peak(Result):
    """The peak over the step's timeline: its bytes, the step (``"backward 32"``) where it falls,
    its bytes by category, and with a device (``gpu=`` or ``device_memory=``) whether it fits and
    the bytes to spare (negative: short)."""
    bytes: int
    step: str
    stage: int
    microbatch: int
    by_category: _t.Dict[str, int]
    fits: _t.Optional[bool]
    spare_bytes: _t.Optional[int]
    reserved_bytes: _t.Optional[int]  # what the caching allocator holds (None: not modelled)
    device_bytes: _t.Optional[int]  # reserved and what lies outside it: nvidia-smi's figure


@_result
class StagePeak(Result):
    """The peak of a layout or a size that fit and plan found: its bytes, on the most loaded
    pipeline stage (``stage``), at ``step``."""
    bytes: int
    step: str
    stage: int


@_result
class ServePeak(Result):
    """Serving's peak per rank: weights, KV cache and prefill's activations, in bytes
    (``bytes``); what the caching allocator reserves for them and what the device shows."""
    bytes: int
    reserved_bytes: int
    device_bytes: int


@_result
class Estimate(Result):
    """One estimate, as ``memcalc --format json`` prints it: ``r.peak.bytes``, ``r.peak.step``,
    ``r.parameters.total``, ``r.state.bytes``, ``r.activations.bytes``; every other key of the
    JSON by ``r[key]`` (``r["timeline"]``, ``r["settings"]``, ...)."""
    memcalc: str
    model: ModelSummary
    parameters: Parameters
    state: TrainingState
    activations: Activations
    peak: Peak
    settings: _t.Dict[str, _t.Any]
    timeline: _t.List[_t.Dict[str, _t.Any]]


@_result
class FitResult(Result):
    """One recomputation mode's answer: the ``largest`` size that fits (None: not even 1), its
    peak and headroom, and the next size up, which does not (``first_over``)."""
    recompute: str
    fits: bool
    largest: _t.Optional[int]
    headroom_bytes: _t.Optional[int]
    peak: _t.Optional[StagePeak]
    first_over: _t.Optional[_t.Dict[str, _t.Any]]


@_result
class Fit(Result):
    """``memcalc fit``: what it searched (``search``: "seq" or "micro_batch") and a result per
    recomputation mode."""
    model: str
    search: str
    capacity_bytes: int
    device_memory_bytes: int
    reserve_bytes: int
    results: _t.List[FitResult]


@_result
class Weights(Result):
    """The weights as served: their format, parameters and bytes per rank."""
    format: str
    parameters: int
    bytes: int


@_result
class KvCache(Result):
    """The KV cache: its bytes, bytes per token and dtype."""
    bytes: int
    bytes_per_token: int
    dtype: str


@_result
class ServeDevice(Result):
    """The device served on: whether it fits, the KV cache's capacity in tokens, the largest
    batch at the context."""
    name: str
    memory_bytes: int
    capacity_bytes: int
    fits: bool
    kv_capacity_tokens: int
    max_batch: int


@_result
class Serve(Result):
    """``memcalc serve``: the weights, the KV cache, prefill's activations and their peak, per
    tensor-parallel rank; with a device, ``device``."""
    weights: Weights
    kv_cache: KvCache
    peak: ServePeak
    device: _t.Optional[ServeDevice]


@_result
class Layout(Result):
    """One layout of ``memcalc plan``: its degrees, ZeRO stage, recomputation, peak and step
    time."""
    rank: int
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int
    zero: int
    schedule: str
    recompute: str
    micro_batch: int
    microbatches: int
    peak: StagePeak
    step_seconds: _t.Optional[float]
    tokens_per_second_per_gpu: _t.Optional[float]


@_result
class Plan(Result):
    """``memcalc plan``: the layouts that fit, best first, and how many were searched."""
    model: str
    gpus: _t.Optional[int]
    capacity_bytes: int
    evaluated: int
    fitting: int
    layouts: _t.List[Layout]
