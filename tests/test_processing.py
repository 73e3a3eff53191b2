"""Preprocess (frame -> tensor) and postprocess (tensors -> dicts) against hand-computed numpy."""

from __future__ import annotations

import json
import warnings

import cv2
import numpy as np
import pytest

from agent.config import (
    ClassificationPostprocess,
    PreprocessConfig,
    RawPostprocess,
    ResizeConfig,
)
from agent.errors import ModelError
from agent.processing import Preprocessor, build_postprocessor
from agent.processing.postprocess import Classification, Raw
from providers import TensorSpec


@pytest.fixture(scope="module")
def frame() -> np.ndarray:
    """A BGR uint8 frame with odd sizes and distinct per-channel content."""
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, size=(37, 53, 3), dtype=np.uint8)
    image[:, :, 0] //= 4  # make B, G and R differ in range so a swapped order shows
    image[:, :, 2] = 255 - image[:, :, 2] // 2
    return image


def _reference(
    frame: np.ndarray,
    width: int,
    height: int,
    color: str,
    scale: float,
    mean: list[float],
    std: list[float],
    layout: str,
) -> np.ndarray:
    """The tensor written out step by step, without the preprocessor's folded multiply-add."""
    resized = cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR)
    if color == "rgb":
        pixels = resized[:, :, ::-1]
    elif color == "gray":
        pixels = cv2.cvtColor(resized, cv2.COLOR_BGR2GRAY)[:, :, None]
    else:
        pixels = resized
    values = (pixels.astype(np.float64) * scale - np.array(mean)) / np.array(std)
    if layout == "nchw":
        values = values.transpose(2, 0, 1)
    return values[None]


def _spec(shape: tuple[object, ...], dtype: str = "float32", name: str = "images") -> TensorSpec:
    return TensorSpec(name, shape, dtype)  # type: ignore[arg-type]


# --- preprocess: values --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_preprocess_matches_reference(frame: np.ndarray, color: str, layout: str) -> None:
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    shape = (1, 3, 24, 32) if layout == "nchw" else (1, 24, 32, 3)
    config = PreprocessConfig(color=color, mean=mean, std=std, layout=layout)
    pre = Preprocessor(config, [_spec(shape)])
    assert (pre.width, pre.height) == (32, 24)  # taken from the model's fixed size
    tensor = pre(frame)
    assert tensor.shape == shape
    assert tensor.dtype == np.float32
    assert tensor.flags["C_CONTIGUOUS"]
    expected = _reference(frame, 32, 24, color, 1 / 255, mean, std, layout)
    np.testing.assert_allclose(tensor, expected, rtol=1e-5, atol=1e-5)


def test_preprocess_color_order_is_really_swapped(frame: np.ndarray) -> None:
    spec = [_spec((1, 3, 24, 32))]
    rgb = Preprocessor(PreprocessConfig(color="rgb"), spec)(frame)
    bgr = Preprocessor(PreprocessConfig(color="bgr"), spec)(frame)
    np.testing.assert_array_equal(rgb[:, 0], bgr[:, 2])
    np.testing.assert_array_equal(rgb[:, 2], bgr[:, 0])
    assert not np.allclose(rgb[:, 0], rgb[:, 2])


def test_preprocess_gray_with_explicit_resize_and_open_model_size(frame: np.ndarray) -> None:
    config = PreprocessConfig(
        color="gray", mean=[0.5], std=[0.25], scale=1 / 255, resize=ResizeConfig(width=20, height=10)
    )
    pre = Preprocessor(config, [_spec(("batch", 1, None, "w"))])
    tensor = pre(frame)
    assert tensor.shape == pre.shape == (1, 1, 10, 20)
    expected = _reference(frame, 20, 10, "gray", 1 / 255, [0.5], [0.25], "nchw")
    np.testing.assert_allclose(tensor, expected, rtol=1e-5, atol=1e-5)


def test_preprocess_scale_only(frame: np.ndarray) -> None:
    config = PreprocessConfig(color="bgr", scale=2.0, layout="nhwc")
    tensor = Preprocessor(config, [_spec((1, 8, 8, 3))])(frame)
    expected = cv2.resize(frame, (8, 8), interpolation=cv2.INTER_LINEAR).astype(np.float32) * 2.0
    np.testing.assert_allclose(tensor[0], expected, rtol=1e-6)


def test_preprocess_float16(frame: np.ndarray) -> None:
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.3, 0.4]
    config = PreprocessConfig(color="rgb", mean=mean, std=std, dtype="float16")
    tensor = Preprocessor(config, [_spec((1, 3, 16, 16), "float16")])(frame)
    assert tensor.dtype == np.float16
    assert tensor.shape == (1, 3, 16, 16)
    expected = _reference(frame, 16, 16, "rgb", 1 / 255, mean, std, "nchw")
    np.testing.assert_allclose(tensor.astype(np.float64), expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(("color", "layout"), [("rgb", "nhwc"), ("bgr", "nchw")])
def test_preprocess_uint8_passes_raw_pixels(frame: np.ndarray, color: str, layout: str) -> None:
    # Quantised models take raw pixels: scale/mean/std must not be applied.
    config = PreprocessConfig(
        color=color, mean=[9.0, 9.0, 9.0], std=[3.0, 3.0, 3.0], layout=layout, dtype="uint8"
    )
    shape = (1, 12, 14, 3) if layout == "nhwc" else (1, 3, 12, 14)
    tensor = Preprocessor(config, [_spec(shape, "uint8")])(frame)
    assert tensor.dtype == np.uint8
    resized = cv2.resize(frame, (14, 12), interpolation=cv2.INTER_LINEAR)
    if color == "rgb":
        resized = resized[:, :, ::-1]
    expected = resized[None] if layout == "nhwc" else resized.transpose(2, 0, 1)[None]
    np.testing.assert_array_equal(tensor, expected)


def test_int8_inputs_are_quantised_with_the_configured_parameters(frame: np.ndarray) -> None:
    quantized = PreprocessConfig(
        mean=[0.5], std=[0.5], dtype="int8", quantization={"scale": 1 / 127, "zero_point": 0}
    )
    tensor = Preprocessor(quantized, [_spec((1, 3, 12, 14), "int8")])(frame)
    real = Preprocessor(PreprocessConfig(mean=[0.5], std=[0.5]), [_spec((1, 3, 12, 14))])(frame)
    assert tensor.dtype == np.int8
    np.testing.assert_array_equal(tensor, np.clip(np.rint(real * 127), -128, 127).astype(np.int8))
    with pytest.raises(ModelError, match=r"takes int8 and the model does not say how it is quantised"):
        Preprocessor(PreprocessConfig(dtype="int8"), [_spec((1, 3, 12, 14), "int8")])
    with pytest.raises(ModelError, match=r"quantization applies to int8 and uint8 inputs, not float32"):
        Preprocessor(PreprocessConfig(quantization={"scale": 0.1, "zero_point": 0}), [_spec((1, 3, 12, 14))])


def test_preprocess_does_not_modify_the_frame(frame: np.ndarray) -> None:
    before = frame.copy()
    Preprocessor(PreprocessConfig(), [_spec((1, 3, 37, 53))])(frame)
    np.testing.assert_array_equal(frame, before)


def test_preprocess_picks_named_input_among_several(frame: np.ndarray) -> None:
    inputs = [_spec((1, 4), name="scale_factor"), _spec((1, 3, 8, 8), name="image")]
    pre = Preprocessor(PreprocessConfig(input="image"), inputs)
    assert pre.input.name == "image"
    assert pre(frame).shape == (1, 3, 8, 8)


# --- preprocess: errors --------------------------------------------------------------------------


def _model_error(config: PreprocessConfig, inputs: list[TensorSpec]) -> str:
    with pytest.raises(ModelError) as info:
        Preprocessor(config, inputs)
    return str(info.value)


def test_error_channel_count_mismatch() -> None:
    message = _model_error(PreprocessConfig(color="rgb"), [_spec((1, 1, 32, 32))])
    assert "1 channels" in message
    assert "'rgb'" in message and "gives 3" in message
    assert "preprocess.layout" in message


def test_error_channel_mismatch_from_wrong_layout() -> None:
    # An NHWC model configured as NCHW: axis 1 is the height (224), not 3 channels.
    message = _model_error(PreprocessConfig(layout="nchw"), [_spec((1, 224, 224, 3))])
    assert "224 channels" in message


def test_error_resize_differs_from_fixed_model_size() -> None:
    config = PreprocessConfig(resize=ResizeConfig(width=640, height=480))
    message = _model_error(config, [_spec((1, 3, 224, 224))])
    assert "640x480" in message and "224x224" in message
    assert "does not match" in message


def test_error_open_size_without_resize() -> None:
    message = _model_error(PreprocessConfig(), [_spec((None, 3, "?", "?"), name="x")])
    assert "'x'" in message and "open size" in message
    assert "preprocess.resize" in message


def test_error_unknown_input_name() -> None:
    message = _model_error(PreprocessConfig(input="pixels"), [_spec((1, 3, 8, 8), name="images")])
    assert "'pixels'" in message and "not a model input" in message
    assert "images" in message


def test_error_multi_input_model_without_input() -> None:
    inputs = [_spec((1, 3, 8, 8), name="image"), _spec((1, 2), name="im_shape")]
    message = _model_error(PreprocessConfig(), inputs)
    assert "2 inputs" in message and "image" in message and "im_shape" in message
    assert "preprocess.input" in message


def test_error_dtype_mismatch() -> None:
    message = _model_error(PreprocessConfig(dtype="float32"), [_spec((1, 3, 8, 8), "float16")])
    assert "float32" in message and "float16" in message and "preprocess.dtype" in message


def test_error_input_not_four_dimensional() -> None:
    message = _model_error(PreprocessConfig(), [_spec((1, 80), name="features")])
    assert "4-D" in message and "'features'" in message


def test_preprocess_errors_are_one_line() -> None:
    message = _model_error(PreprocessConfig(color="gray", mean=[0.0], std=[1.0]), [_spec((1, 3, 8, 8))])
    assert "\n" not in message


# --- postprocess: classification -----------------------------------------------------------------


def _softmax(values: np.ndarray) -> np.ndarray:
    exp = np.exp(values - values.max())
    return exp / exp.sum()


def _classify(config: ClassificationPostprocess, spec: TensorSpec, value: np.ndarray) -> list[dict]:
    post = build_postprocessor(config, [spec])
    assert isinstance(post, Classification)
    result = post({spec.name: value})
    json.dumps(result)  # JSON-ready: plain ints, floats, strings
    return result["top"]


def _cls_config(**kwargs: object) -> ClassificationPostprocess:
    return ClassificationPostprocess(type="classification", **kwargs)  # type: ignore[arg-type]


def test_softmax_matches_manual_computation() -> None:
    logits = np.array([[1.0, 3.0, -2.0, 0.5]], dtype=np.float32)
    top = _classify(_cls_config(top_k=4), _spec((1, 4), name="logits"), logits)
    manual = np.exp(logits[0].astype(np.float64)) / np.exp(logits[0].astype(np.float64)).sum()
    assert [t["index"] for t in top] == [1, 0, 3, 2]
    for entry in top:
        assert entry["score"] == pytest.approx(manual[entry["index"]], abs=1e-6)
    assert sum(t["score"] for t in top) == pytest.approx(1.0, abs=1e-5)
    assert all(t["label"] is None for t in top)


def test_softmax_large_logits_do_not_overflow() -> None:
    logits = np.array([[1000.0, 1002.0, 998.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow in exp would warn
        top = _classify(_cls_config(top_k=3), _spec((1, 3)), logits)
    expected = _softmax(np.array([1000.0, 1002.0, 998.0]))  # == softmax([2, 4, 0])
    assert [t["index"] for t in top] == [1, 0, 2]
    for entry in top:
        assert np.isfinite(entry["score"])
        assert entry["score"] == pytest.approx(expected[entry["index"]], abs=1e-6)
    assert top[0]["score"] == pytest.approx(np.exp(2) / (np.exp(2) + 1 + np.exp(-2)), abs=1e-6)


def test_softmax_very_negative_logits() -> None:
    logits = np.array([[-5000.0, -5001.0]], dtype=np.float32)
    top = _classify(_cls_config(top_k=2), _spec((1, 2)), logits)
    assert top[0]["index"] == 0
    assert top[0]["score"] == pytest.approx(1 / (1 + np.exp(-1)), abs=1e-6)


def test_top_k_ordering_and_labels() -> None:
    scores = np.array([[0.1, 0.05, 0.4, 0.15, 0.3]], dtype=np.float32)
    labels = ["cat", "dog", "car", "bus", "tree"]
    top = _classify(_cls_config(top_k=3, softmax=False, labels=labels), _spec((1, 5)), scores)
    assert [t["index"] for t in top] == [2, 4, 3]
    assert [t["label"] for t in top] == ["car", "tree", "bus"]
    assert [t["score"] for t in top] == pytest.approx([0.4, 0.3, 0.15], abs=1e-6)
    assert top == sorted(top, key=lambda t: -t["score"])


def test_top_k_larger_than_class_count() -> None:
    top = _classify(_cls_config(top_k=10), _spec((1, 3)), np.array([[0.0, 1.0, 2.0]], np.float32))
    assert [t["index"] for t in top] == [2, 1, 0]


def test_top_1_default() -> None:
    top = _classify(_cls_config(), _spec((1, 4)), np.array([[0.0, 0.0, 9.0, 1.0]], np.float32))
    assert len(top) == 1 and top[0]["index"] == 2


def test_softmax_false_passes_scores_through() -> None:
    # Already probabilities (as the PP-OCR cls model outputs): a second softmax would flatten them.
    probs = np.array([[0.993416, 0.006584]], dtype=np.float32)
    top = _classify(_cls_config(top_k=2, softmax=False, labels=["0", "180"]), _spec((None, 2)), probs)
    assert [(t["label"], t["score"]) for t in top] == [
        ("0", pytest.approx(0.993416, abs=1e-6)),
        ("180", pytest.approx(0.006584, abs=1e-6)),
    ]


def test_nchw_shaped_scores() -> None:
    logits = np.array([0.3, -1.0, 2.5, 0.0], dtype=np.float32).reshape(1, 4, 1, 1)
    labels = ["a", "b", "c", "d"]
    top = _classify(_cls_config(top_k=2, labels=labels), _spec((1, 4, 1, 1)), logits)
    expected = _softmax(logits.reshape(-1).astype(np.float64))
    assert [t["label"] for t in top] == ["c", "a"]
    assert top[0]["score"] == pytest.approx(expected[2], abs=1e-6)


def test_flat_scores() -> None:
    top = _classify(_cls_config(softmax=False), _spec((3,)), np.array([0.2, 0.7, 0.1], np.float32))
    assert top[0]["index"] == 1


def test_labels_count_mismatch_raises() -> None:
    config = _cls_config(labels=["a", "b", "c"])
    with pytest.raises(ModelError) as info:
        build_postprocessor(config, [_spec((1, 4, 1, 1), name="prob")])
    message = str(info.value)
    assert "3 names" in message and "4 classes" in message and "'prob'" in message


def test_labels_count_mismatch_with_dynamic_batch() -> None:
    with pytest.raises(ModelError, match=r"2 names .* 1000 classes"):
        build_postprocessor(_cls_config(labels=["a", "b"]), [_spec(("N", 1000))])


def test_labels_not_checked_when_class_count_is_open() -> None:
    post = build_postprocessor(_cls_config(labels=["a", "b"]), [_spec(("N", "C"))])
    top = post({"images": np.array([[0.0, 5.0]], np.float32)})["top"]
    assert top[0]["label"] == "b"


def test_batch_larger_than_one_raises() -> None:
    post = build_postprocessor(_cls_config(), [_spec((None, 2), name="prob")])
    with pytest.raises(ModelError, match="batch size 2"):
        post({"prob": np.zeros((2, 2), np.float32)})


def test_output_selection_by_name() -> None:
    outputs = [_spec((1, 4), name="boxes"), _spec((1, 3), name="scores")]
    post = build_postprocessor(_cls_config(output="scores", softmax=False), outputs)
    top = post({"boxes": np.array([[9.0, 9.0, 9.0, 9.0]]), "scores": np.array([[0.2, 0.5, 0.3]])})["top"]
    assert top[0]["index"] == 1
    with pytest.raises(ModelError) as info:
        build_postprocessor(_cls_config(output="logits"), outputs)
    assert "'logits'" in str(info.value) and "boxes" in str(info.value) and "scores" in str(info.value)


def test_default_output_is_the_first() -> None:
    outputs = [_spec((1, 2), name="first"), _spec((1, 3), name="second")]
    post = build_postprocessor(_cls_config(softmax=False), outputs)
    assert (
        post({"first": np.array([[0.1, 0.9]]), "second": np.array([[1.0, 0.0, 0.0]])})["top"][0]["index"] == 1
    )


# --- postprocess: raw ----------------------------------------------------------------------------


def test_raw_truncates_and_flags() -> None:
    post = build_postprocessor(RawPostprocess(type="raw", max_values=5), [_spec((1, 2, 3))])
    assert isinstance(post, Raw)
    value = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    small = np.array([[1, 2]], dtype=np.int64)
    result = post({"big": value, "small": small})
    json.dumps(result)
    big = result["outputs"]["big"]
    assert big == {
        "shape": [1, 2, 3],
        "dtype": "float32",
        "values": [0.0, 1.0, 2.0, 3.0, 4.0],
        "truncated": True,
    }
    assert result["outputs"]["small"] == {
        "shape": [1, 2],
        "dtype": "int64",
        "values": [1, 2],
        "truncated": False,
    }


def test_raw_exactly_max_values_is_not_truncated() -> None:
    post = Raw(RawPostprocess(type="raw", max_values=4))
    out = post({"y": np.ones((2, 2), dtype=np.float16)})["outputs"]["y"]
    assert out["truncated"] is False
    assert out["values"] == [1.0, 1.0, 1.0, 1.0]
    assert out["dtype"] == "float16"
    assert out["shape"] == [2, 2]


def test_raw_turns_non_finite_values_into_null() -> None:
    from agent.config import RawPostprocess
    from agent.processing.postprocess import Raw

    out = Raw(RawPostprocess(type="raw", max_values=10))(
        {"y": np.array([[1.5, np.nan, np.inf, -np.inf]], np.float32)}
    )
    assert out["outputs"]["y"]["values"] == [1.5, None, None, None]
    json.dumps(out, allow_nan=False)  # valid JSON now
