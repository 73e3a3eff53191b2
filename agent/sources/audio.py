"""Audio from WAV files, resampled to the model's rate and cut into windows (size, hop).

The reader thread hands windows to a FrameQueue: nothing is skipped while the model keeps up
within `max_queue` windows. A file plays at its recorded pace (`realtime`), as a microphone
would deliver it, or as fast as the model takes it. Each window's `position_s` is where it starts
in the file; the first window after an (re)open or a loop carries `gap`, so recurrent state is reset.
"""

from __future__ import annotations

import logging
import time
import wave
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np
from scipy.signal import resample_poly

from agent.config import AudioSourceConfig
from agent.errors import EdgeAgentError
from agent.retry import backoff_delay
from agent.sources.base import ThreadedSource
from agent.sources.frames import Frame, FrameQueue

log = logging.getLogger(__name__)

_SAMPLE_TYPES = {1: np.uint8, 2: np.int16, 4: np.int32}  # PCM sample width in bytes -> dtype


def read_wav(path: Path, rate: int) -> np.ndarray:
    """The first channel of a PCM WAV file as float32 in [-1, 1], resampled to `rate`.

    EdgeAgentError says what is wrong with a file that is missing or not PCM WAV.
    """
    try:
        with wave.open(str(path), "rb") as wav:
            width, channels, source_rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except FileNotFoundError:
        raise EdgeAgentError(f"audio file {path} does not exist") from None
    except (wave.Error, EOFError, OSError) as exc:
        raise EdgeAgentError(f"{path} is not a PCM WAV file: {exc}") from None
    if width == 3:  # 24-bit: widen to 32-bit by hand (numpy has no 3-byte integer)
        bytes3 = np.frombuffer(raw, np.uint8).reshape(-1, 3)
        samples = (bytes3.astype(np.int32) << np.array([8, 16, 24])).sum(axis=1, dtype=np.int32)
        width = 4
    elif width in _SAMPLE_TYPES:
        samples = np.frombuffer(raw, _SAMPLE_TYPES[width])
    else:
        raise EdgeAgentError(f"{path}: {8 * width}-bit samples are not supported (8, 16, 24 or 32-bit PCM)")
    samples = samples[: len(samples) - len(samples) % channels].reshape(-1, channels)[:, 0]
    if width == 1:  # unsigned 8-bit: 128 is silence
        audio = (samples.astype(np.float32) - 128.0) / 128.0
    else:
        audio = samples.astype(np.float32) / float(2 ** (8 * width - 1))
    if source_rate != rate:
        common = gcd(source_rate, rate)
        audio = resample_poly(audio, rate // common, source_rate // common).astype(np.float32)
    return audio


class AudioSource(ThreadedSource):
    """Reads one audio source in its own thread into `queue`, window by window."""

    kind = "audio-file"

    def __init__(self, config: AudioSourceConfig, name: str, queue: FrameQueue) -> None:
        super().__init__(name, queue, config.uri)
        self.config = config
        self.hop = config.hop or config.window
        self.windows = 0

    def _counters(self) -> dict[str, Any]:
        return {"windows": self.windows}

    def _run(self) -> None:
        failures = 0
        index = 0
        try:
            while not self._stop.is_set():
                try:
                    audio = read_wav(Path(self.config.uri), self.config.sample_rate)
                except EdgeAgentError as exc:
                    failures += 1
                    self._count_reconnect()
                    self._fail(str(exc))
                    delay = backoff_delay(failures, self.config.reopen_min_s, self.config.reopen_max_s)
                    self._stop.wait(delay)
                    continue
                failures = 0
                index = self._play(audio, index)
                if self._stop.is_set():
                    return
                if not self.config.loop:
                    self._set_state("finished")
                    log.info("source %s: end of %s", self.name, self.display_uri)
                    return
        finally:
            if self.state != "finished":
                self._set_state("stopped", self.error)
            self.slot.close()

    def _play(self, audio: np.ndarray, index: int) -> int:
        """Hand every full window of `audio` to the queue; returns the next window index."""
        rate, window = self.config.sample_rate, self.config.window
        self._set_state("streaming")
        started = time.monotonic()
        first = True
        for start in range(0, len(audio) - window + 1, self.hop):  # full windows only
            if self._stop.is_set():
                break
            if self.config.realtime:  # a window is there once its last sample would have been heard
                due = started + (start + window) / rate
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    break
            index += 1
            chunk = audio[start : start + window]
            frame = Frame(
                data=chunk, index=index, captured_at=time.time(), position_s=start / rate, gap=first
            )
            self.slot.put(frame)
            first = False
            with self._lock:
                self.windows += 1
        return index
