"""A model version's test data: inputs its publisher ships in the manifest (and, optionally, the
outputs they must give), so that selection proves backends on inputs the model is made for even
before the pipeline's source delivers a frame.

The file is a NumPy `.npz` archive, an artifact of format "test-data" (hashed and verified like
the model files). Each array named after a model input is that input's value; an array named
`expected:<output name>` is what that output must be (within the selection tolerances). Arrays
are plain numbers (no pickled objects: `np.load(allow_pickle=False)`).

    np.savez("inputs.npz", x=image_batch, **{"expected:softmax_0.tmp_0": probabilities})

Strings are NumPy unicode arrays (dtype `<U…`, no pickle). The ONNX model zoo's layout
(`test_data_set_N/input_K.pb`, `output_K.pb`: serialized TensorProtos) is converted to this form at
publish time (`model_zoo_testdata`), one archive per set. A test data artifact may carry the
tolerances its expected outputs hold to (manifest `rtol`/`atol`; model-zoo data default to the
onnx backend test runner's rtol 1e-3, atol 1e-7): then every value must be within them.
"""

from __future__ import annotations

import io
import logging
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import ModelError
from providers.base import Backend, BackendError, ModelArtifact, one_line

if TYPE_CHECKING:  # imported where test data is read or checked: a config's checks need neither
    import numpy as np

    from providers.select import Sample

log = logging.getLogger(__name__)

EXPECTED_PREFIX = "expected:"
FORMAT = "test-data"
_VALUE_KINDS = frozenset("biufcU")  # bool, int, uint, float, complex, unicode strings
# The onnx backend test runner's default tolerances, for model-zoo test data published without others.
MODEL_ZOO_RTOL, MODEL_ZOO_ATOL = 1e-3, 1e-7


@dataclass(frozen=True)
class TestData:
    """A test data artifact of a model version, as selection takes it."""

    __test__ = False  # not a pytest test class

    artifact: ModelArtifact
    model_file: str | None = None  # the model file it is for (None: any it fits)
    rtol: float | None = None  # tolerances its expected outputs hold to (None: the selection policy's)
    atol: float | None = None


def load_testdata(path: Path, label: str | None = None) -> Sample:
    """Read a test data archive; ModelError says what is wrong with it (`label` names it)."""
    import numpy as np

    from providers.select import Sample

    label = label or path.name
    feeds: dict[str, np.ndarray] = {}
    expected: dict[str, np.ndarray] = {}
    try:
        with path.open("rb") as f:
            if f.read(6) == b"\x93NUMPY":
                raise ModelError(f"{label} is not valid test data: a single .npy array, not an .npz archive")
        if not zipfile.is_zipfile(path):  # else numpy takes any other file for a pickle
            raise ModelError(f"{label} is not valid test data: not a NumPy .npz archive (no zip structure)")
        archive = np.load(path, allow_pickle=False)
        with archive:  # a zip file: np.load gave an NpzFile
            for key in archive.files:
                value = archive[key]
                if not isinstance(value, np.ndarray):  # a zip member that is no .npy array
                    raise ModelError(f"{label} is not valid test data: member {key!r} is not a NumPy array")
                if value.dtype.kind not in _VALUE_KINDS:
                    raise ModelError(
                        f"{label} is not valid test data: array {key!r} holds {value.dtype}, "
                        "not numbers or strings"
                    )
                if key.startswith(EXPECTED_PREFIX):
                    expected[key.removeprefix(EXPECTED_PREFIX)] = value
                else:
                    feeds[key] = value
    except ModelError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{label} is not valid test data (a NumPy .npz archive): {one_line(exc)}") from None
    if not feeds:
        raise ModelError(
            f"{label} is not valid test data: no input arrays "
            f"(it has {', '.join(map(repr, expected)) or 'no arrays'}; "
            "name each input array after the model input it feeds)"
        )
    return Sample(feeds, f"test data {label}", expected or None)


def testdata_samples(
    testdata: Sequence[TestData],
    models: Sequence[ModelArtifact],
    backends: Sequence[Backend],
) -> list[Sample]:
    """Samples from the test data artifacts, each marked with the model artifacts it fits and
    carrying its tolerances.

    An archive that cannot be read or fits no artifact is left out with a warning: selection then
    proves the model on the pipeline's own input, as without test data.
    """
    samples = []
    for data, sample, why in testdata_fits(testdata, models, backends):
        if sample is None:
            log.warning("ignoring test data %s: %s", data.artifact.label, why)
        else:
            samples.append(sample)
    return samples


def testdata_fits(
    testdata: Sequence[TestData],
    models: Sequence[ModelArtifact],
    backends: Sequence[Backend],
) -> list[tuple[TestData, Sample | None, str]]:
    """Each test data artifact with its sample (None when it cannot be read or fits no model
    file, and why)."""
    from providers.select import Sample, feeds_problem, reference_session

    if not testdata:
        return []
    specs = {}
    for model in models:
        try:
            session = reference_session([model], backends)
        except BackendError:
            continue  # no CPU backend reads it: it is proven on other inputs or not at all
        try:
            specs[model.sha256] = session.inputs
        finally:
            session.close()
    found: list[tuple[TestData, Sample | None, str]] = []
    for data in testdata:
        artifact, model_file = data.artifact, data.model_file
        try:
            sample = load_testdata(artifact.path, artifact.label)
        except ModelError as exc:
            found.append((data, None, exc.message))
            continue
        meant = [m for m in models if model_file is None or model_file in (m.name, m.derived_from)]
        problems = {m.label: feeds_problem(specs[m.sha256], sample.feeds) for m in meant if m.sha256 in specs}
        # A model file no CPU backend here reads cannot be checked against: the candidates that try
        # it say what they make of it.
        fits = frozenset(m.sha256 for m in meant if problems.get(m.label, "") == "")
        if not fits:
            why = "; ".join(f"{name}: {problem}" for name, problem in problems.items()) or (
                f"no model file {model_file!r} in this version"
                if model_file
                else "no model file to check it on"
            )
            found.append((data, None, f"it fits no model file ({why})"))
            continue
        found.append(
            (data, Sample(sample.feeds, sample.origin, sample.expected, fits, data.rtol, data.atol), "")
        )
    return found


def testdata_problem(model: ModelArtifact, sample: Sample, backends: Sequence[Backend] | None = None) -> str:
    """What is wrong with `sample` as test data of `model` ("" if nothing): its inputs must fit, and
    its expected outputs must be what a plain CPU backend computes from them. BackendError when
    no CPU backend here can read the model."""
    from providers.select import SelectionPolicy, compare_outputs, feeds_problem, reference_session

    session = reference_session([model], backends)
    try:
        problem = feeds_problem(session.inputs, sample.feeds)
        if problem or not sample.expected:
            return problem
        outputs = session.run(sample.feeds)
    finally:
        session.close()
    _diff, problem = compare_outputs(outputs, sample.expected, SelectionPolicy())
    if problem:
        return f"its expected outputs are not what {model.label} computes on {session.backend}: {problem}"
    return ""


@dataclass(frozen=True)
class TestFile:
    """A test data file to publish or validate with."""

    __test__ = False  # not a pytest test class

    path: Path  # where its bytes are (a converted model-zoo set lives in a temp dir)
    name: str  # its file name in the version
    rtol: float | None
    atol: float | None


def testdata_files(
    entries: Sequence[Path],
    model_path: Path,
    format: str,
    converted: Path,
    rtol: float | None = None,
    atol: float | None = None,
) -> list[TestFile]:
    """The test data files `entries` name: .npz archives as they are; model-zoo folders converted
    into `converted`, one archive per set, with the model zoo's default tolerances unless given.
    ModelError says what is wrong with an entry."""
    files: list[TestFile] = []
    for entry in map(Path, entries):
        if entry.is_file():
            files.append(TestFile(entry, entry.name, rtol, atol))
            continue
        if not entry.is_dir():
            raise ModelError(f"test data {entry}: no such file or folder")
        if format != "onnx":
            raise ModelError(f"test data {entry}: model-zoo test data is for ONNX models")
        inputs, outputs = onnx_io_names(model_path)
        for set_dir in model_zoo_sets(entry):
            target = converted / f"{len(files)}" / f"{set_dir.name}.npz"
            target.parent.mkdir(parents=True)
            target.write_bytes(model_zoo_testdata(set_dir, inputs, outputs))
            files.append(
                TestFile(
                    target,
                    target.name,
                    MODEL_ZOO_RTOL if rtol is None else rtol,
                    MODEL_ZOO_ATOL if atol is None else atol,
                )
            )
    return files


def onnx_io_names(model_path: Path) -> tuple[list[str], list[str]]:
    """The graph inputs (initializers excluded) and outputs of an ONNX model, in order."""
    import onnx

    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception as exc:
        raise ModelError(f"cannot read {model_path} as ONNX: {one_line(exc)}") from None
    initializers = {t.name for t in graph.initializer}
    return [i.name for i in graph.input if i.name not in initializers], [o.name for o in graph.output]


# --- the ONNX model zoo's test data layout ----------------------------------------------------------

_SET_FILE = re.compile(r"^(input|output)_(\d+)\.pb$")


def is_model_zoo_set(path: Path) -> bool:
    """A folder of input_K.pb (and output_K.pb) files, as the model zoo ships `test_data_set_N`."""
    return path.is_dir() and any(_SET_FILE.match(p.name) for p in path.iterdir())


def model_zoo_sets(path: Path) -> list[Path]:
    """The test data sets `path` names: itself when it is one, else its `test_data_set_*` folders
    (a model's folder in the zoo); ModelError when there are none."""
    if is_model_zoo_set(path):
        return [path]
    sets = sorted(
        (p for p in path.glob("test_data_set_*") if is_model_zoo_set(p)),
        key=lambda p: [int(n) if n.isdigit() else n for n in re.split(r"(\d+)", p.name)],
    )
    if not sets:
        raise ModelError(
            f"{path} holds no ONNX test data: expected input_0.pb ... files, "
            "or test_data_set_N folders of them"
        )
    return sets


def model_zoo_testdata(set_dir: Path, input_names: Sequence[str], output_names: Sequence[str]) -> bytes:
    """One model-zoo test data set as the bytes of an .npz archive (this module's format).

    Tensors are matched to the model's inputs and outputs by their own names, else by position
    (input_K.pb feeds the K-th graph input that is not an initializer). Any ONNX tensor type is
    taken; strings become unicode arrays. Sequences, maps and optionals are refused by name.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    feeds: dict[str, np.ndarray] = {}
    expected: dict[str, np.ndarray] = {}
    files = sorted(
        (m.group(1), int(m.group(2)), p) for p in set_dir.iterdir() if (m := _SET_FILE.match(p.name))
    )
    for kind, index, path in files:
        names = input_names if kind == "input" else output_names
        tensor = onnx.TensorProto()
        try:
            tensor.ParseFromString(path.read_bytes())
            value = numpy_helper.to_array(tensor)
        except Exception as exc:  # DecodeError, or a proto that is not a tensor
            raise ModelError(
                f"{path}: not an ONNX TensorProto ({one_line(exc)}); sequence, map and optional "
                "test data are not supported"
            ) from None
        # A tensor's own name where the graph has it; else by position (some sets name the tensors
        # differently from the graph's inputs).
        name = tensor.name if tensor.name in names else (names[index] if index < len(names) else "")
        if not name:
            raise ModelError(f"{path}: the model has no {kind} number {index} (it has {len(names)})")
        if value.dtype.kind == "O":  # strings (bytes from the proto): no pickles in the archive
            value = np.array([v.decode() if isinstance(v, bytes) else str(v) for v in value.flat]).reshape(
                value.shape
            )
        (feeds if kind == "input" else expected)[name] = value
    if not feeds:
        raise ModelError(f"{set_dir}: no input_K.pb files")
    return testdata_bytes(feeds, expected)


def testdata_bytes(
    feeds: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray] | None = None
) -> bytes:
    """An .npz archive of inputs and expected outputs (this module's format)."""
    import numpy as np

    arrays = {**feeds, **{EXPECTED_PREFIX + k: v for k, v in (expected or {}).items()}}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()
