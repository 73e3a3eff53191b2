"""Backend selection: which backends a pipeline may use, how candidates are proven, and each
backend's options (`backends.options.<backend name>`), typed per runtime so that a misspelt option is
reported by `edge-agent config validate` with its line, like any other unknown key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import InitErrorDetails, core_schema

from agent.config.base import StrictModel, carried, validate_typed
from providers.options import EP_OPTIONS, TFLITE_OPTIONS, CpuOptions, OpenVinoOptions, options_model

# --- each backend's options: the providers' own models (providers/options.py) ---------------------

_BACKEND_NAMES = "onnxruntime/<execution provider>, openvino/<device>, tflite/cpu or tflite/edgetpu"


class PerBackendOptions:
    """The type of `backends.options`: backend name -> its options, each checked by its backend's model.

    What a config holds (and a backend is handed) stays the mapping the YAML gives, with the keys it
    gives and their values as the model reads them (`model_dump(exclude_unset=True)`): which keys are
    set matters downstream (an unset thread count lets the trials try one core fewer; an unset
    cache_dir gets one under the state dir)."""

    @staticmethod
    def model_for_key(key: str) -> type[BaseModel] | None:
        """The model of a key's value (config_loader follows it to list the keys allowed there)."""
        return options_model(key)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(_check_per_backend, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        by_name: dict[str, JsonSchemaValue] = {}
        ep_names = "|".join(EP_OPTIONS)
        by_name[f"^onnxruntime/(?!({ep_names})$).+$"] = _schema_of(CpuOptions, handler)
        for ep, model in EP_OPTIONS.items():
            by_name[f"^onnxruntime/{ep}$"] = _schema_of(model, handler)
        by_name["^openvino/.+$"] = _schema_of(OpenVinoOptions, handler)
        for device, tflite in TFLITE_OPTIONS.items():
            by_name[f"^tflite/{device}$"] = _schema_of(tflite, handler)
        return {
            "type": "object",
            "propertyNames": {
                "pattern": f"^(onnxruntime/.+|openvino/.+|tflite/({'|'.join(TFLITE_OPTIONS)}))$"
            },
            "patternProperties": by_name,
        }


def _schema_of(model: type[BaseModel], handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    return handler(model.__pydantic_core_schema__)


def _check_per_backend(
    value: Any, handler: Callable[[Any], dict[str, dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    checked: dict[str, dict[str, Any]] = {}
    problems: list[InitErrorDetails] = []
    for backend, given in handler(value).items():
        model = options_model(backend)
        if model is None:
            why = ValueError(f"no backend is called {backend!r}; options are per backend: {_BACKEND_NAMES}")
            problems.append({"type": "value_error", "loc": (backend,), "input": given, "ctx": {"error": why}})
            continue
        try:
            checked[backend] = validate_typed(model, given).model_dump(exclude_unset=True)
        except ValidationError as exc:
            problems.extend(carried(e, (backend, *e["loc"])) for e in exc.errors())
    if problems:
        raise ValidationError.from_exception_data("options", problems, hide_input=True)
    return checked


BackendOptionsMap = Annotated[dict[str, dict[str, Any]], PerBackendOptions()]


class BackendChoiceConfig(StrictModel):
    """Which backends a pipeline may use; patterns are globs over backend names."""

    prefer: list[str] = Field(
        default_factory=list, description="Try these first, in this order, e.g. ['openvino/*']."
    )
    deny: list[str] = Field(default_factory=list, description="Never use these, e.g. ['tflite/*'].")
    fixed: str | None = Field(
        None, description="Use only this backend, e.g. onnxruntime/CPUExecutionProvider."
    )


class SelectionConfig(BackendChoiceConfig):
    """Agent-wide backend selection: policy, proof (benchmark + output check) and backend options."""

    benchmark: bool = Field(True, description="Prove the top candidates on a real sample before choosing.")
    max_trials: int = Field(3, ge=1, le=20, description="How many ranked candidates to benchmark.")
    warmup: int = Field(3, ge=1, le=1000)
    runs: int = Field(20, ge=1, le=100_000, description="At least this many timed runs per candidate ...")
    min_time_s: float = Field(1.0, ge=0, description="... and at least this long (stable medians).")
    budget_s: float = Field(5.0, gt=0, description="Timed runs stop after this long per candidate.")
    timeout_s: float = Field(
        180.0, gt=0, description="A candidate that takes longer (load+runs) is rejected."
    )
    rounds: int = Field(
        5,
        ge=0,
        le=100,
        description="The correct candidates that compete on speed are timed again side by side in this "
        "many interleaved rounds (A B, B A, ...): a busy moment costs one turn, not the choice. 0: each "
        "candidate's own trial figures.",
    )
    turn_s: float = Field(0.2, gt=0, le=60, description="How long each candidate runs in one round's turn.")
    sample_timeout_s: float = Field(15.0, gt=0, description="How long to wait for a sample from the source.")
    prove_in_background: bool = Field(
        True,
        description="A pipeline starting with no proven decision for its model serves on the CPU reference "
        "at once, and the candidates are proven beside it on its first frame (the winner takes over "
        "between two frames); off: it waits for the trials before its first result.",
    )
    spare_core: bool = Field(
        True,
        description="Time the CPU backends (onnxruntime CPU, OpenVINO CPU) with one core fewer too, and "
        "run a model that is at most 10% slower that way: the core left decodes, prepares and reports "
        "frames beside inference. Off, or a thread count in options: the runtime's own threads.",
    )
    match_iou: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Output check of detectors: a candidate's detections must match the reference's by class "
        "at this IoU (pipelines with a detection or classification postprocess are judged on their reports).",
    )
    rtol: float = Field(1e-2, ge=0, description="Output check: relative tolerance against the CPU reference.")
    atol: float = Field(1e-3, ge=0, description="Output check: absolute tolerance.")
    max_mismatch: float = Field(
        0.001, ge=0, le=1, description="Share of an output's values allowed outside the tolerance."
    )
    options: BackendOptionsMap = Field(
        default_factory=dict,
        description="Options per backend name, e.g. {'openvino/CPU': {'hint': 'throughput'}}: each "
        "runtime's keys (docs/backends.md), checked with the rest of the config.",
    )
    batching: Literal["auto", "off"] = Field(
        "auto",
        description="Pipelines that share a session (same model and backend): frames that arrive while "
        "it is busy run as one batch, when the model has a dynamic batch axis and the first batches "
        "prove it faster with the same outputs (auto); or always one by one (off).",
    )
    max_batch: int = Field(8, ge=2, le=256, description="Most frames in one batched run.")
