"""Detection for real: a trained YOLOv8n (nudenet's 320n.onnx, 18 classes with faces) on a real photo
(scikit-image's astronaut), through letterbox preprocessing and the detection postprocessor, on
every backend of this machine that reads ONNX. Boxes must land on the face in source-image pixels,
whatever the frame's size and where the letterbox puts it.

MODELS.md, observed with the wheel's own decoding: FACE_FEMALE 0.811, box [173, 82, 274, 180].
The model is AGPL-3.0 (see MODELS.md): used in tests only, never shipped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from agent.config import DetectionPostprocess, PreprocessConfig, ResizeConfig
from agent.errors import ModelError
from agent.processing import Geometry, Preprocessor, build_postprocessor
from providers import ModelArtifact, Session, TensorSpec, get_backend
from tests.cpu_precision import exact_options
from tests.media_fixtures import FACE_BOX, astronaut_bgr, iou

ONNX_BACKENDS = ("onnxruntime/CPUExecutionProvider", "openvino/CPU", "openvino/AUTO")


def _detect(
    session: Session, frame: np.ndarray, labels: list[str], anchor: str = "top-left", pad: int = 0
) -> list[dict[str, object]]:
    resize = ResizeConfig(width=320, height=320, mode="letterbox", anchor=anchor, pad=pad)  # type: ignore[arg-type]
    preprocess = Preprocessor(PreprocessConfig(resize=resize, color="rgb", scale=1 / 255), session.inputs)
    postprocess = build_postprocessor(
        DetectionPostprocess(type="detection", score_threshold=0.25, labels=labels), session.outputs
    )
    tensor, geometry = preprocess.prepare(frame)
    assert tensor.shape == (1, 3, 320, 320) and tensor.dtype == np.float32
    detections: list[dict[str, object]] = postprocess(session.run({"images": tensor}), geometry)["detections"]
    return detections


def _face(detections: list[dict[str, object]]) -> dict[str, object]:
    faces = [d for d in detections if d["label"] == "FACE_FEMALE"]
    assert faces, detections
    return faces[0]


@pytest.mark.parametrize("backend", ONNX_BACKENDS)
def test_yolo_finds_the_astronauts_face_on_every_backend(
    backend: str, yolo_path: Path, yolo_labels: list[str]
) -> None:
    # f32 on every backend: this is about the postprocessing, not about bf16 on some CPUs.
    session = get_backend(backend).load(ModelArtifact(yolo_path, "onnx", "0" * 64), exact_options(backend))
    try:
        square = _detect(session, astronaut_bgr(), yolo_labels)
        # The same photo in a wider frame, off centre, letterboxed to the middle with grey bars:
        # the box must follow the photo (shifted by 128 px) through a different scale and padding.
        wide = np.full((512, 768, 3), 90, np.uint8)
        wide[:, 128:640] = astronaut_bgr()
        shifted = _detect(session, wide, yolo_labels, anchor="center", pad=114)
    finally:
        session.close()

    face = _face(square)
    assert face["index"] == yolo_labels.index("FACE_FEMALE") == 1
    assert float(face["score"]) >= 0.5, face  # type: ignore[arg-type]
    box = np.array(face["box"])
    assert iou(box, FACE_BOX) >= 0.8, box
    assert square[0] is face, square  # the best detection is the face (conf >= 0.5 per MODELS.md)
    # Sorted by score, every score above the threshold, boxes inside the 512x512 photo.
    scores = [float(d["score"]) for d in square]  # type: ignore[arg-type]
    assert scores == sorted(scores, reverse=True) and min(scores) >= 0.25
    assert all(0 <= v <= 512 for d in square for v in d["box"])  # type: ignore[attr-defined]

    wide_face = np.array(_face(shifted)["box"])
    assert iou(wide_face, FACE_BOX + np.array([128, 0, 128, 0])) >= 0.7, wide_face


def test_nothing_is_found_in_a_blank_frame(yolo_path: Path, yolo_labels: list[str]) -> None:
    session = get_backend(ONNX_BACKENDS[0]).load(ModelArtifact(yolo_path, "onnx", "0" * 64))
    try:
        assert _detect(session, np.full((480, 640, 3), 127, np.uint8), yolo_labels) == []
    finally:
        session.close()


# --- geometry: what the letterbox and the crop do to coordinates ----------------------------------


def _preprocessor(mode: str, anchor: str = "center", width: int = 320, height: int = 320) -> Preprocessor:
    resize = ResizeConfig(width=width, height=height, mode=mode, anchor=anchor)  # type: ignore[arg-type]
    return Preprocessor(
        PreprocessConfig(resize=resize, color="bgr", scale=1.0),
        [TensorSpec("x", (1, 3, height, width), "float32")],
    )


def test_letterbox_keeps_the_aspect_and_pads_with_the_pad_value() -> None:
    frame = np.zeros((100, 200, 3), np.uint8)
    frame[:, :, 2] = 255  # red, in BGR
    tensor, geometry = _preprocessor("letterbox").prepare(frame)
    assert geometry == Geometry(1.6, 1.6, 0, 80, 200, 100, 320, 320)
    image = tensor[0].transpose(1, 2, 0)  # bgr, scale 1: raw pixel values
    assert (image[80:240, :, 2] == 255).all() and (image[80:240, :, 0] == 0).all()
    assert (image[:80] == 114).all() and (image[240:] == 114).all()  # bars above and below

    _, top_left = _preprocessor("letterbox", anchor="top-left").prepare(frame)
    assert (top_left.offset_x, top_left.offset_y) == (0, 0)


def test_centre_crop_cuts_the_overhang_and_maps_boxes_back() -> None:
    frame = np.arange(100 * 200, dtype=np.uint32).reshape(100, 200)
    frame = np.stack([frame % 251, frame % 241, frame % 239], axis=2).astype(np.uint8)
    preprocess = _preprocessor("crop", width=100, height=100)
    tensor, geometry = preprocess.prepare(frame)
    assert geometry == Geometry(1.0, 1.0, -50, 0, 200, 100, 100, 100)
    assert (tensor[0].transpose(1, 2, 0) == frame[:, 50:150]).all()  # the middle square, unscaled
    # A box in the model input is the same box 50 px to the right in the frame; outside parts clip.
    boxes = geometry.to_source(np.array([[10.0, 20.0, 30.0, 40.0], [-80.0, 0.0, 10.0, 120.0]]))
    assert boxes.tolist() == [[60.0, 20.0, 80.0, 40.0], [0.0, 0.0, 60.0, 100.0]]


def test_stretch_is_the_default_and_scales_each_axis() -> None:
    preprocess = Preprocessor(
        PreprocessConfig(resize=ResizeConfig(width=64, height=32)),
        [TensorSpec("x", (1, 3, 32, 64), "float32")],
    )
    geometry = preprocess.geometry(100, 400)
    assert geometry == Geometry(0.16, 0.32, 0, 0, 400, 100, 64, 32)
    assert geometry.to_source(np.array([[16.0, 16.0, 32.0, 32.0]])).tolist() == [[100.0, 50.0, 200.0, 100.0]]


# --- bad outputs and bad settings: clear errors -------------------------------------------------------


def _yolo_output(rows: np.ndarray) -> dict[str, np.ndarray]:
    return {"out": rows.T[None].astype(np.float32)}  # [1, 4+C, N]


def test_yolov5_rows_multiply_objectness_by_class_score() -> None:
    spec = [TensorSpec("out", (1, 3, 7), "float32")]
    post = build_postprocessor(
        DetectionPostprocess(type="detection", format="yolov5", labels=["a", "b"]), spec
    )
    rows = np.array(
        [
            [50, 50, 20, 20, 0.9, 0.1, 0.8],  # b: 0.72
            [52, 50, 20, 20, 0.5, 0.1, 0.9],  # b: 0.45, overlaps the first: suppressed
            [10, 10, 4, 4, 0.2, 0.9, 0.1],  # a: 0.18, under the threshold
        ],
        np.float32,
    )
    detections = post({"out": rows[None]})["detections"]
    assert detections == [{"index": 1, "label": "b", "score": 0.72, "box": [40.0, 40.0, 60.0, 60.0]}]


def test_nms_is_per_class_and_max_detections_caps_the_list() -> None:
    spec = [TensorSpec("out", (1, 6, None), "float32")]
    rows = np.array(
        [[50, 50, 20, 20, 0.9, 0.0], [50, 50, 20, 20, 0.0, 0.8], [200, 200, 10, 10, 0.7, 0.0]], np.float32
    )
    post = build_postprocessor(DetectionPostprocess(type="detection"), spec)
    found = post(_yolo_output(rows))["detections"]
    assert [(d["index"], d["score"]) for d in found] == [(0, 0.9), (1, 0.8), (0, 0.7)]  # same box, 2 classes
    capped = build_postprocessor(DetectionPostprocess(type="detection", max_detections=2), spec)
    assert len(capped(_yolo_output(rows))["detections"]) == 2


@pytest.mark.parametrize(
    ("shape", "config", "message"),
    [
        ((1, 22), {}, r"output 'out' has shape \[1, 22\]; yolov8 detections are 3-D"),
        ((1, 4, 2100), {}, r"no room for class scores in yolov8 format \(check postprocess.format\)"),
        (
            (1, 22, 2100),
            {"labels": ["a", "b"]},
            r"postprocess.labels has 2 names but output 'out' has 18 classes",
        ),
        ((1, 22, 2100), {"format": "yolov5"}, None),  # 2095 classes: odd, but a valid reading
        ((1, 22, 2100), {"output": "boxes"}, r"postprocess.output 'boxes' is not a model output"),
    ],
)
def test_settings_that_do_not_fit_the_output_are_refused(
    shape: tuple[int, ...], config: dict[str, object], message: str | None
) -> None:
    spec = [TensorSpec("out", shape, "float32")]
    settings = DetectionPostprocess.model_validate({"type": "detection", **config})
    if message is None:
        build_postprocessor(settings, spec)
        return
    with pytest.raises(ModelError, match=message):
        build_postprocessor(settings, spec)


def test_nan_boxes_fail_the_frame_with_a_clear_error() -> None:
    post = build_postprocessor(
        DetectionPostprocess(type="detection"), [TensorSpec("out", (1, 5, None), "float32")]
    )
    rows = np.array([[np.nan, 50, 20, 20, 0.9]], np.float32)
    with pytest.raises(ModelError, match="NaN or infinite box coordinates"):
        post(_yolo_output(rows))
    with pytest.raises(ModelError, match=r"has shape \[2, 5, 1\], expected \[1, ., .\]"):
        post({"out": np.zeros((2, 5, 1), np.float32)})
    nan_scores = np.array([[50, 50, 20, 20, np.nan]], np.float32)
    assert post(_yolo_output(nan_scores))["detections"] == []  # a NaN score is no detection


def test_ssd_rows_are_normalised_boxes_scaled_to_the_input_and_mapped_back() -> None:
    spec = [TensorSpec("detection_out", (1, 1, None, 7), "float32")]
    settings = DetectionPostprocess(type="detection", format="ssd", labels=["bg", "person", "car"])
    post = build_postprocessor(settings, spec)
    rows = np.array(
        [
            [0, 1, 0.9, 0.10, 0.20, 0.30, 0.60],  # a person
            [0, 1, 0.6, 0.11, 0.21, 0.31, 0.61],  # the same person again: suppressed
            [0, 2, 0.7, 0.50, 0.50, 0.90, 0.90],  # a car
            [0, 2, 0.1, 0.00, 0.00, 0.10, 0.10],  # under the threshold
            [-1, 0, 0.0, 0.0, 0.0, 0.0, 0.0],  # end of the list
            [0, 1, 0.99, 0.0, 0.0, 1.0, 1.0],  # after the end: ignored
        ],
        np.float32,
    )[None, None]
    # A 640x480 frame letterboxed into 300x300: scale 0.46875, 37 px bars above and below.
    geometry = Geometry(0.46875, 0.46875, 0, 37, 640, 480, 300, 300)
    found = post({"detection_out": rows}, geometry)["detections"]
    assert [(d["label"], d["score"]) for d in found] == [("person", 0.9), ("car", 0.7)]
    x1, y1, x2, y2 = found[0]["box"]
    assert (x1, x2) == pytest.approx((0.10 * 300 / 0.46875, 0.30 * 300 / 0.46875), abs=0.1)
    assert (y1, y2) == pytest.approx(((0.20 * 300 - 37) / 0.46875, (0.60 * 300 - 37) / 0.46875), abs=0.1)
    with pytest.raises(ModelError, match=r"ssd detections are \[1, 1, N, 7\]"):
        build_postprocessor(settings, [TensorSpec("out", (1, 22, 2100), "float32")])


# --- separate boxes / scores / classes / count outputs (TensorFlow Object Detection API style) --------


def _with_tensorflow_style_outputs(yolo_path: Path, folder: Path, keep: int = 100) -> Path:
    """The real YOLOv8n with its decoding appended as ONNX nodes, as exporters with built-in
    post-processing do: detection_boxes [1, keep, 4] (ymin, xmin, ymax, xmax in 0..1),
    detection_scores [1, keep], detection_classes [1, keep] (float ids), num_detections [1]
    (scores >= 0.25). The top `keep` boxes by score, no NMS (the postprocessor does it)."""
    model = onnx.load(str(yolo_path))
    graph = model.graph
    (raw,) = [o.name for o in graph.output]
    const = onnx.helper.make_tensor

    def node(op: str, inputs: list[str], output: str, **attrs: object) -> str:
        graph.node.append(onnx.helper.make_node(op, inputs, [output], **attrs))
        return output

    for name, values, dtype in [
        ("k_split", [1, 1, 1, 1, 18], onnx.TensorProto.INT64),
        ("k_size", [320.0], onnx.TensorProto.FLOAT),
        ("k_half", [0.5], onnx.TensorProto.FLOAT),
        ("k_top", [keep], onnx.TensorProto.INT64),
        ("k_zero", [0], onnx.TensorProto.INT64),
        ("k_one", [1], onnx.TensorProto.INT64),
        ("k_threshold", [0.25], onnx.TensorProto.FLOAT),
    ]:
        graph.initializer.append(const(name, dtype, [len(values)], values))
    rows = node("Transpose", [raw], "d_rows", perm=[0, 2, 1])  # [1, 2100, 22]
    graph.node.append(
        onnx.helper.make_node("Split", [rows, "k_split"], ["d_cx", "d_cy", "d_w", "d_h", "d_cls"], axis=2)
    )
    half_w = node("Mul", ["d_w", "k_half"], "d_hw")
    half_h = node("Mul", ["d_h", "k_half"], "d_hh")
    corners = [
        node("Div", [node(op, [centre, half], f"d_{name}_px"), "k_size"], f"d_{name}")
        for name, op, centre, half in [
            ("ymin", "Sub", "d_cy", half_h),
            ("xmin", "Sub", "d_cx", half_w),
            ("ymax", "Add", "d_cy", half_h),
            ("xmax", "Add", "d_cx", half_w),
        ]
    ]
    boxes = node("Concat", corners, "d_boxes", axis=2)  # [1, 2100, 4]
    scores = node("ReduceMax", ["d_cls"], "d_scores", axes=[2], keepdims=0)  # [1, 2100] (opset 17)
    classes = node("Cast", [node("ArgMax", ["d_cls"], "d_ids", axis=2, keepdims=0)], "d_classes", to=1)
    graph.node.append(onnx.helper.make_node("TopK", [scores, "k_top"], ["detection_scores", "d_top"], axis=1))
    top = node("Squeeze", ["d_top", "k_zero"], "d_top_1d")
    top_boxes = node("Gather", [node("Squeeze", [boxes, "k_zero"], "d_b"), top], "d_tb")
    node("Unsqueeze", [top_boxes, "k_zero"], "detection_boxes")
    top_classes = node("Gather", [node("Squeeze", [classes, "k_zero"], "d_c"), top], "d_tc")
    node("Unsqueeze", [top_classes, "k_zero"], "detection_classes")
    above = node("Cast", [node("GreaterOrEqual", ["detection_scores", "k_threshold"], "d_ge")], "d_gef", to=1)
    node("ReduceSum", [above, "k_one"], "num_detections", keepdims=0)  # opset 13+: axes as an input
    del graph.output[:]
    for name, shape in [
        ("detection_boxes", [1, keep, 4]),
        ("detection_scores", [1, keep]),
        ("detection_classes", [1, keep]),
        ("num_detections", [1]),
    ]:
        graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape))
    onnx.checker.check_model(model)
    path = folder / "yolov8n-tf-outputs.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("backend", ONNX_BACKENDS)
def test_separate_detection_tensors_find_the_face_on_every_backend(
    backend: str, yolo_path: Path, yolo_labels: list[str], tmp_path: Path
) -> None:
    path = _with_tensorflow_style_outputs(yolo_path, tmp_path)
    session = get_backend(backend).load(ModelArtifact(path, "onnx", "0" * 64), exact_options(backend))
    try:
        settings = DetectionPostprocess(type="detection", format="tensors", labels=yolo_labels)
        post = build_postprocessor(settings, session.outputs)  # outputs found by their names
        wide = np.full((512, 768, 3), 90, np.uint8)
        wide[:, 128:640] = astronaut_bgr()
        resize = ResizeConfig(width=320, height=320, mode="letterbox", anchor="center", pad=114)
        preprocess = Preprocessor(PreprocessConfig(resize=resize, color="rgb", scale=1 / 255), session.inputs)
        tensor, geometry = preprocess.prepare(wide)
        outputs = session.run({"images": tensor})
    finally:
        session.close()
    assert 0 < int(outputs["num_detections"][0]) <= 100
    face = _face(post(outputs, geometry)["detections"])
    assert float(face["score"]) >= 0.5  # type: ignore[arg-type]
    assert iou(np.array(face["box"]), FACE_BOX + np.array([128, 0, 128, 0])) >= 0.7, face


def test_separate_detection_tensors_rules() -> None:
    specs = [
        TensorSpec("boxes", (1, 3, 4), "float32"),
        TensorSpec("scores", (1, 3), "float32"),
        TensorSpec("count", (1,), "float32"),
    ]
    settings = DetectionPostprocess(type="detection", format="tensors", box_order="xyxy", normalized=False)
    post = build_postprocessor(settings, specs)  # no classes output: every box is class 0
    outputs = {
        "boxes": np.array([[[10, 20, 50, 60], [11, 21, 51, 61], [0, 0, 5, 5]]], np.float32),
        "scores": np.array([[0.9, 0.8, 0.95]], np.float32),
        "count": np.array([2.0], np.float32),  # the third row is past the count: ignored
    }
    assert post(outputs)["detections"] == [{"index": 0, "label": None, "score": 0.9, "box": [10, 20, 50, 60]}]
    with pytest.raises(ModelError, match=r"are not N boxes of 4 and N scores"):
        post({**outputs, "scores": np.zeros((1, 2), np.float32)})
    with pytest.raises(
        ModelError, match=r"no model output looks like the detection scores .*set postprocess.scores"
    ):
        build_postprocessor(
            settings, [TensorSpec("boxes", (1, 3, 4), "float32"), TensorSpec("p", (1, 3), "float32")]
        )
    named = DetectionPostprocess(type="detection", format="tensors", scores="p")
    with pytest.raises(
        ModelError, match=r"postprocess.scores 'p' is not a model output; outputs: \['boxes', 'q'\]"
    ):
        build_postprocessor(
            named, [TensorSpec("boxes", (1, 3, 4), "float32"), TensorSpec("q", (1, 3), "float32")]
        )
