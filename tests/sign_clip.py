"""A rendered clip of moving signs with known text, for the attributes step (issue 36: PP-OCR det ->
cls -> rec on each tracked text region) and its peer reading by rapidocr's own engine
(tests/test_sign_clip.py).

640x360 at 10 fps, 12 s (120 frames). Each sign is one line of dark text (4-10 letters and digits)
on a light plate, in one of two lanes (the top one and the bottom one, far enough apart that their
boxes never overlap), moving horizontally at its own steady speed. Fonts: Pillow's bundled Aileron
and five DejaVu faces (sans, sans bold, serif, serif bold, mono); capitals 20-48 px high. Some signs are
upside down (the plate rotated 180 degrees); most cross the vertical line down the middle of the
frame (`LINE_X`), left to right (`east`) or right to left (`west`); some stay in one half; some
enter or leave through the frame's edge, the others appear and vanish inside it (fully visible all
their time). Two are on screen at once at times.

The truth is plain geometry of the drawing, not taken from any model: per sign its text, font,
text height, orientation, lane, path (first and last frame, centre x at each), the frames it is
wholly inside the frame, its ink box on any frame, and when its centre crosses the middle line and
which way. Frames are written lossless (FFV1 in Matroska, ~14 MB, ~1 s to write): a decoded frame
is the drawing to the pixel (`draw`), so the truth's ink boxes are exact and every reader sees the
same crisp text (MJPG at quality 100 moved plate edges by up to 35 grey levels). OpenCV's FFmpeg
backend reads it, as the daemon's `video` source and `edge-agent infer` do.

`DETECTOR_PIPELINE` is the PP-OCRv4 det model's preprocess and postprocess (as agent.yaml says
them) that find exactly one region per sign on this clip (checked in tests/test_sign_clip.py).

Test modules get the clip from the session-scoped fixture: `sign_clip = sign_clip_module.sign_clip`
(re-exported, as tests/media_fixtures.py's fixtures are), rendered once per session.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT, FPS, SECONDS = 640, 360, 10, 12.0
FRAMES = round(FPS * SECONDS)
LINE_X = WIDTH / 2  # the vertical line down the middle; crossing it left to right is `east`
LANES = {"top": 95, "bottom": 265}  # each lane's centre row: plates at most ~90 px tall never meet

# The PP-OCRv4 text detector's settings for this clip, as a pipeline's YAML says them (BGR,
# (x/255 - 0.5)/0.5; H and W multiples of 32, ../shared/MODELS.md). Measured on every frame whose
# signs are all wholly inside it (105 of 120): exactly one region per sign, each covering the text's
# ink; so too at 640x352 stretched and with unclip 1.5 (at 960x544 with 1.5, two boxes cut the ink's
# end). The letterbox keeps the text's aspect; unclip 2.0 leaves >= 0.13 text heights above and
# below the ink and >= 0.08 at the sides (1.5: 0.03, and at the sides sometimes none), the margin a
# recognizer's crop wants. A sign partly out of the picture gives a region for its visible part, or
# none for a sliver.
DETECTOR_PIPELINE: dict[str, Any] = {
    "preprocess": {
        "resize": {"width": 640, "height": 384, "mode": "letterbox", "pad": 255},
        "color": "bgr",
        "mean": [0.5],
        "std": [0.5],
    },
    "postprocess": {"type": "regions", "threshold": 0.3, "unclip_ratio": 2.0},
}
# The line down the middle as a pipeline's `lines:` entry says it: walking it from top to bottom,
# crossing from its right side to its left (left to right in the picture) is `in` (docs/analytics.md),
# named as the truth names the directions.
MIDDLE_LINE: dict[str, Any] = {
    "name": "middle",
    "points": [[0.5, 0], [0.5, 1]],
    "in": "east",
    "out": "west",
    "anchor": "center",
}

# Fonts, all drawn by Pillow: its bundled Aileron (Pillow >= 10.1) and five DejaVu faces from
# Debian's fonts-dejavu-core (scripts/setup.sh installs it). Not OpenCV's putText: OpenCV 5 draws
# every FONT_HERSHEY_* but SIMPLEX with one built-in sans face, and 4.x with stroke fonts, so the clip
# would depend on the OpenCV version.
DEJAVU = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = {
    "dejavu-sans": "DejaVuSans.ttf",
    "dejavu-sans-bold": "DejaVuSans-Bold.ttf",
    "dejavu-serif": "DejaVuSerif.ttf",
    "dejavu-serif-bold": "DejaVuSerif-Bold.ttf",
    "dejavu-sans-mono": "DejaVuSansMono.ttf",
}
FONTS = ("aileron", *FONT_FILES)


@dataclass(frozen=True)
class SignSpec:
    """A sign as the clip's table writes it: its text, drawing and path. It is drawn from frame
    `first` to frame `last`, its centre moving at a steady speed from column `start` to `end`
    ("left"/"right": just outside that edge, so it enters or leaves through it)."""

    text: str
    font: str
    height: int  # the text's cap height in pixels (the ink of capital letters and digits)
    upside_down: bool
    lane: str
    first: int
    last: int
    start: float | str
    end: float | str


# The clip's signs: seven a lane, 12 frames each with 2 empty ones between, the bottom lane 6 frames
# behind the top one (two signs on screen most of the time, one at others); all gone by frame 101,
# so every track ends (the tracker's max_lost_s, 1 s) well within the clip. The top lane's signs move
# right and the bottom lane's left, each appearing on the side its predecessor came from: a tracker
# that still predicts the one before (for max_lost_s, at its speed) never finds the next one there
# (its box overlaps that prediction by IoU <= 0.12, under the tracker's min_iou 0.2), so each sign
# is one track. Ten cross the middle line (the top lane's `east`, the bottom lane's `west`); four do
# not (STOP and BAY8 stay left, STOP coming to 15 px short of it; CARGO and TRUCK24 stay right).
# Four are upside down; five enter through an edge (the top lane's from the left, the bottom's from
# the right). Plate-like codes and short words, upper case (no 0/O or 1/I a font could draw alike),
# and no spaces: PP-OCR's recognizer reads a space or not depending on its width (it read the fonts'
# own spaces in "KX42 BRT" as "KX42BRT"), and its detector splits a line at a wider gap.
SIGNS: tuple[SignSpec, ...] = (
    SignSpec("KX42BRT", "dejavu-sans-bold", 30, False, "top", 0, 11, 140, 470),
    SignSpec("EXIT", "aileron", 40, False, "bottom", 6, 17, "right", 200),
    SignSpec("GATE3", "dejavu-serif", 26, False, "top", 14, 25, 130, 460),
    SignSpec("DOCK9", "dejavu-sans-mono", 38, True, "bottom", 20, 31, 500, 170),
    SignSpec("HW62KPD", "aileron", 24, False, "top", 28, 39, "left", 440),
    SignSpec("LANE4", "dejavu-serif-bold", 45, True, "bottom", 34, 45, 490, 170),
    SignSpec("STOP", "dejavu-sans", 46, False, "top", 42, 53, 120, 305),
    SignSpec("CARGO", "dejavu-sans-bold", 36, False, "bottom", 48, 59, 520, 380),
    SignSpec("PARKING", "aileron", 32, True, "top", 56, 67, "left", 525),
    SignSpec("MR73XYV", "dejavu-sans-mono", 22, False, "bottom", 62, 73, "right", 200),
    SignSpec("BAY8", "dejavu-sans", 31, True, "top", 70, 81, 90, 250),
    SignSpec("YARD6", "dejavu-serif", 40, False, "bottom", 76, 87, 500, 170),
    SignSpec("WT29HNL", "aileron", 20, False, "top", 84, 95, "left", 470),
    SignSpec("TRUCK24", "dejavu-serif-bold", 29, False, "bottom", 90, 101, 510, 370),
)

INK = (28, 28, 32)  # BGR: near-black text
PLATES = ((226, 236, 240), (200, 232, 246), (236, 236, 226), (214, 226, 232))  # light plates, BGR


@dataclass(frozen=True)
class Sign:
    """A sign of the rendered clip and its truth."""

    index: int
    spec: SignSpec
    width: int  # the plate's size in pixels
    plate_height: int
    ink: tuple[int, int, int, int]  # the text's ink box inside the plate (x1, y1, x2, y2), as drawn
    first: int  # the first and last frame it is drawn on
    last: int
    x_first: float  # its centre's column on those frames
    x_last: float
    # A frame it is wholly inside the frame on, shared with the other lane's sign where one is whole
    # there too (a lossless clip draws the same plate on every frame: any whole one is as clear), so
    # a reader of every sign reads 7 frames, not 14 (`reading_frames`).
    reading_frame: int = -1

    @property
    def text(self) -> str:
        return self.spec.text

    @property
    def upside_down(self) -> bool:
        return self.spec.upside_down

    @property
    def centre_y(self) -> int:
        return LANES[self.spec.lane]

    def centre_x(self, frame: int) -> float | None:
        """Its centre's column on a frame, None when it is not drawn there."""
        if not self.first <= frame <= self.last:
            return None
        if self.last == self.first:
            return self.x_first
        return self.x_first + (self.x_last - self.x_first) * (frame - self.first) / (self.last - self.first)

    def plate_box(self, frame: int) -> tuple[int, int, int, int] | None:
        """The plate's box (x1, y1, x2, y2) on a frame, as drawn (may reach past the frame's edge)."""
        x = self.centre_x(frame)
        if x is None:
            return None
        left, top = round(x - self.width / 2), self.centre_y - self.plate_height // 2
        return left, top, left + self.width, top + self.plate_height

    def text_box(self, frame: int) -> tuple[int, int, int, int] | None:
        """The text's ink box on a frame (rotated with the plate when upside down), clipped to the frame."""
        plate = self.plate_box(frame)
        if plate is None:
            return None
        x1, y1, x2, y2 = self.ink
        if self.upside_down:
            x1, y1, x2, y2 = self.width - x2, self.plate_height - y2, self.width - x1, self.plate_height - y1
        box = (plate[0] + x1, plate[1] + y1, plate[0] + x2, plate[1] + y2)
        clipped = (max(0, box[0]), max(0, box[1]), min(WIDTH, box[2]), min(HEIGHT, box[3]))
        return clipped if clipped[2] > clipped[0] and clipped[3] > clipped[1] else None

    def whole(self, frame: int) -> bool:
        """The plate is wholly inside the frame."""
        plate = self.plate_box(frame)
        return plate is not None and plate[0] >= 0 and plate[2] <= WIDTH

    @property
    def crossing(self) -> tuple[int, str] | None:
        """The first frame its centre is past the middle line and the way it went (`east`: left to
        right), or None when it stays on one side."""
        if (self.x_first - LINE_X) * (self.x_last - LINE_X) >= 0:
            return None
        for frame in range(self.first, self.last + 1):
            x = self.centre_x(frame)
            assert x is not None
            if (x - LINE_X) * (self.x_first - LINE_X) < 0:
                return frame, "east" if self.x_last > self.x_first else "west"
        return None

    def truth(self) -> dict[str, Any]:
        """Its truth as plain JSON types."""
        crossing = self.crossing
        inside = [f for f in range(self.first, self.last + 1) if self.whole(f)]
        return {
            "index": self.index,
            "text": self.text,
            "font": self.spec.font,
            "text_height": self.ink[3] - self.ink[1],  # as drawn (the table's is what was asked)
            "upside_down": self.upside_down,
            "lane": self.spec.lane,
            "speed_px_s": round(abs(self.x_last - self.x_first) / max(1, self.last - self.first) * FPS, 1),
            "first_frame": self.first,
            "last_frame": self.last,
            "enter_s": self.first / FPS,
            "exit_s": (self.last + 1) / FPS,
            "x_first": round(self.x_first, 1),
            "x_last": round(self.x_last, 1),
            "whole_frames": [inside[0], inside[-1]],
            "reading_frame": self.reading_frame,
            "crosses": None
            if crossing is None
            else {"frame": crossing[0], "t_s": crossing[0] / FPS, "direction": crossing[1]},
        }


@dataclass(frozen=True)
class SignClip:
    """The rendered clip: its file, its signs (the truth) and its format."""

    path: Path
    signs: tuple[Sign, ...]
    width: int = WIDTH
    height: int = HEIGHT
    fps: int = FPS
    frames: int = FRAMES
    line_x: float = LINE_X

    @property
    def reading_frames(self) -> list[int]:
        """The frames that show every sign whole at least once (each sign's `reading_frame`)."""
        return sorted({s.reading_frame for s in self.signs})

    def on_screen(self, frame: int) -> list[Sign]:
        """The signs with some text inside the frame, top lane first."""
        return sorted(
            (s for s in self.signs if s.text_box(frame) is not None), key=lambda s: LANES[s.spec.lane]
        )

    def truth(self) -> list[dict[str, Any]]:
        return [s.truth() for s in self.signs]


# --- drawing ---------------------------------------------------------------------------------------


def _ink_box(gray: np.ndarray) -> tuple[int, int, int, int]:
    rows, cols = np.nonzero(gray < 128)
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


def _text_image(text: str, font: str, height: int) -> np.ndarray:
    """The text in black on white, cropped to its ink (grey, uint8), its capitals `height` px high."""
    # The size whose "H" is `height` px of ink: a font's nominal size says little about its ink.
    size = round(height * 100 / _drawn(font, "H", 100).shape[0])
    return _drawn(font, text, size)


def _drawn(font: str, text: str, size: int) -> np.ndarray:
    """`text` in `font` at `size` (Pillow's), black on white, cropped to its ink."""
    if font == "aileron":
        face = ImageFont.load_default(size=size)
    else:
        path = DEJAVU / FONT_FILES[font]
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: apt-get install fonts-dejavu-core (scripts/setup.sh)"
            )
        face = ImageFont.truetype(str(path), size)
    left, top, right, bottom = face.getbbox(text)
    canvas = Image.new("L", (right - left + 20, bottom - top + 20), 255)
    ImageDraw.Draw(canvas).text((10 - left, 10 - top), text, font=face, fill=0)
    gray = np.asarray(canvas)
    x1, y1, x2, y2 = _ink_box(gray)
    return gray[y1:y2, x1:x2]


def _plate(spec: SignSpec, colour: tuple[int, int, int]) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The sign's plate (BGR) with its text, rotated when upside down; the ink box as drawn upright."""
    text = _text_image(spec.text, spec.font, spec.height)
    pad_x, pad_y = round(0.6 * spec.height), round(0.45 * spec.height)
    th, tw = text.shape
    plate = np.empty((th + 2 * pad_y, tw + 2 * pad_x, 3), np.uint8)
    plate[:] = colour
    alpha = (255 - text.astype(np.float32))[..., None] / 255  # ink coverage: antialiased edges blend
    region = plate[pad_y : pad_y + th, pad_x : pad_x + tw].astype(np.float32)
    region = region * (1 - alpha) + np.asarray(INK, np.float32) * alpha
    plate[pad_y : pad_y + th, pad_x : pad_x + tw] = np.rint(region).astype(np.uint8)
    cv2.rectangle(plate, (0, 0), (plate.shape[1] - 1, plate.shape[0] - 1), (150, 150, 150), 1)  # its rim
    if spec.upside_down:
        plate = cv2.rotate(plate, cv2.ROTATE_180)
    return plate, (pad_x, pad_y, pad_x + tw, pad_y + th)


@cache
def _background() -> np.ndarray:
    """A gently shaded, lightly textured wall (fixed: the same every frame; do not write to it)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    shade = np.stack([70 + 40 * x / WIDTH, 90 + 30 * y / HEIGHT, 80 + 20 * (x + y) / (WIDTH + HEIGHT)], -1)
    grain = np.random.default_rng(36).normal(0, 3, (HEIGHT // 4, WIDTH // 4, 1)).astype(np.float32)
    shade += cv2.resize(grain, (WIDTH, HEIGHT), interpolation=cv2.INTER_LINEAR)[..., None]
    return np.clip(shade, 0, 255).astype(np.uint8)


def _edge(where: float | str, width: int) -> float:
    if where == "left":
        return -width / 2
    if where == "right":
        return WIDTH + width / 2
    assert isinstance(where, (int, float)), where
    return float(where)


@cache
def signs() -> tuple[tuple[Sign, np.ndarray], ...]:
    """Every sign with its plate image, its path worked out from the table."""
    made = []
    for index, spec in enumerate(SIGNS):
        plate, ink = _plate(spec, PLATES[index % len(PLATES)])
        start, end = _edge(spec.start, plate.shape[1]), _edge(spec.end, plate.shape[1])
        sign = Sign(index, spec, plate.shape[1], plate.shape[0], ink, spec.first, spec.last, start, end)
        made.append((sign, plate))
    chosen = _reading_frames([sign for sign, _ in made])
    return tuple((replace(sign, reading_frame=chosen[sign.index]), plate) for sign, plate in made)


def _reading_frames(signs: list[Sign]) -> dict[int, int]:
    """Sign index -> a frame it is whole on: in order of appearance, the frame of its whole ones that
    shows the most signs still without one whole (ties: the one nearest the middle of its path)."""
    chosen: dict[int, int] = {}
    for sign in signs:
        if sign.index in chosen:
            continue
        whole = [f for f in range(sign.first, sign.last + 1) if sign.whole(f)]
        middle = (whole[0] + whole[-1]) / 2

        def others(frame: int) -> list[Sign]:
            return [s for s in signs if s.index not in chosen and s.whole(frame)]

        best = max(whole, key=lambda f: (len(others(f)), -abs(f - middle)))
        for other in others(best):
            chosen[other.index] = best
    return chosen


def draw(frame_index: int) -> np.ndarray:
    """Frame `frame_index` of the clip as drawn (BGR), before the video's compression."""
    frame = _background().copy()
    for sign, plate in signs():
        box = sign.plate_box(frame_index)
        if box is None:
            continue
        x0, y0 = box[0], box[1]
        xs, xe = max(0, x0), min(WIDTH, x0 + sign.width)
        if xe > xs:
            frame[y0 : y0 + sign.plate_height, xs:xe] = plate[:, xs - x0 : xe - x0]
    return frame


def render(path: Path) -> SignClip:
    """Write the clip to `path` (.mkv: FFV1, lossless) and return it with its truth."""
    writer = cv2.VideoWriter(str(path), cv2.CAP_FFMPEG, cv2.VideoWriter.fourcc(*"FFV1"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write FFV1 to {path}")
    try:
        for frame_index in range(FRAMES):
            writer.write(draw(frame_index))
    finally:
        writer.release()
    return SignClip(path, tuple(sign for sign, _ in signs()))


@pytest.fixture(scope="session")
def sign_clip(tmp_path_factory: pytest.TempPathFactory) -> SignClip:
    """The clip, rendered once per test session."""
    return render(tmp_path_factory.mktemp("sign-clip") / "signs.mkv")


@pytest.fixture(scope="session")
def peer_readings(sign_clip: SignClip) -> dict[int, list[str]]:
    """rapidocr's own engine, `RapidOCR()` as it ships (det -> cls -> rec, its direction classifier
    on), on the decoded clip's reading frames: sign index -> the texts it read on the sign's
    reading frame whose box's centre is inside that sign's text box (one, when it reads the sign as
    one line)."""
    from rapidocr_onnxruntime import RapidOCR  # (needs pyclipper and shapely: the dev extra)

    engine = RapidOCR()
    frames = read_frames(sign_clip.path)
    found = {frame: engine(frames[frame], use_cls=True)[0] or [] for frame in sign_clip.reading_frames}
    readings = {}
    for sign in sign_clip.signs:
        box = sign.text_box(sign.reading_frame)
        assert box is not None  # (it is whole there)
        x1, y1, x2, y2 = box
        readings[sign.index] = [
            str(text)
            for quad, text, _score in found[sign.reading_frame]
            if x1 <= sum(p[0] for p in quad) / 4 <= x2 and y1 <= sum(p[1] for p in quad) / 4 <= y2
        ]
    return readings


def read_frames(path: Path) -> list[np.ndarray]:
    """Every frame of a clip, decoded by OpenCV's FFmpeg backend (as the daemon's video source)."""
    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    frames = []
    try:
        for _ in range(FRAMES + 1):  # bounded: one more than the clip has, to see its end
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(frame)
    finally:
        capture.release()
    return frames
