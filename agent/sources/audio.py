"""Audio from WAV files or live ALSA capture, at the model's rate, cut into windows (size, hop).

The reader thread hands windows to a FrameQueue: nothing is skipped while the model keeps up
within `max_queue` windows. A file plays at its recorded pace (`realtime`), as a microphone
would deliver it, or as fast as the model takes it. Each window's `position_s` is where it starts
in the file; the first window after an (re)open or a loop carries `gap`, so recurrent state is reset.
Live capture (`alsa:DEVICE`) runs arecord and reads its raw PCM: the sound card sets the pace; a card
that vanishes or falls silent for 5 s is an outage, reopened with backoff.
"""

from __future__ import annotations

import logging
import time
import wave
from collections.abc import Iterator
from math import gcd
from pathlib import Path

import numpy as np

from agent.config import AudioSourceConfig
from agent.errors import EdgeAgentError
from agent.retry import backoff_delay
from agent.sources.base import ThreadedSource
from agent.sources.child import ChildStream
from agent.sources.frames import Frame, FrameQueue, Windower
from agent.status import AudioCounters

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
        # Imported here: scipy.signal maps ~110 shared libraries into every daemon, audio or not.
        from scipy.signal import resample_poly

        common = gcd(source_rate, rate)
        audio = resample_poly(audio, rate // common, source_rate // common).astype(np.float32)
    return audio


def audio_windows(audio: np.ndarray, window: int, hop: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first sample, samples) of every full window of `audio`, window starts `hop` apart: what a
    file source hands its pipeline (a last, partial window is left out)."""
    for start in range(0, len(audio) - window + 1, hop):
        yield start, audio[start : start + window]


ALSA_PREFIX = "alsa:"  # uri "alsa:DEVICE": live capture through arecord, e.g. alsa:plughw:1,0
_CAPTURE_READ_TIMEOUT_S = 5.0  # a sound card that delivers nothing for this long is reopened


class AudioSource(ThreadedSource):
    """Reads one audio source (a WAV file, or live capture from an ALSA device) in its own thread
    into `queue`, window by window."""

    def __init__(self, config: AudioSourceConfig, name: str, queue: FrameQueue) -> None:
        super().__init__(name, queue, config.uri)
        self.config = config
        self.queue = queue
        self.hop = config.hop or config.window
        self.device = config.uri[len(ALSA_PREFIX) :] if config.uri.startswith(ALSA_PREFIX) else None
        self.kind = "audio-file" if self.device is None else "audio-capture"
        self.windows = 0

    def _counters(self) -> AudioCounters:
        return AudioCounters(self.windows)

    def _run(self) -> None:
        failures = 0
        index = 0
        try:
            while not self._stop.is_set():
                try:
                    if self.device is not None:
                        index, streamed = self._capture(self.device, index)
                        if streamed:  # it delivered, then broke off: retry after the shortest delay
                            failures = 0
                    else:
                        audio = read_wav(Path(self.config.uri), self.config.sample_rate)
                        failures = 0
                        index = self._play(audio, index)
                        if self._stop.is_set():
                            return
                        if not self.config.loop:
                            self._set_state("finished")
                            log.info("source %s: end of %s", self.name, self.display_uri)
                            return
                        continue
                except EdgeAgentError as exc:
                    self._fail(str(exc))
                if self._stop.is_set():
                    return
                failures += 1
                self._count_reconnect()
                self._stop.wait(backoff_delay(failures, self.config.reopen_min_s, self.config.reopen_max_s))
        finally:
            if self.state != "finished":
                self._set_state("stopped", self.error)
            self.slot.close()

    def _capture(self, device: str, index: int) -> tuple[int, bool]:
        """Windows from the ALSA device until stop or failure; returns (next index, whether any came).

        arecord asks ALSA for 16-bit mono at the model's rate: a `plughw:` or `default` device
        converts whatever the card has; a bare `hw:` device refuses what it cannot do itself.
        """
        rate = self.config.sample_rate
        argv = ["arecord", "-D", device, "-t", "raw", "-f", "S16_LE", "-c", "1", "-r", str(rate)]
        child = ChildStream(argv, "apt-get install alsa-utils", chatter=("Recording ",))
        windows = Windower(self.queue, self.config.window, self.hop)
        windows.index = index
        chunk_bytes = 2 * min(self.hop, self.config.window)
        streamed = False
        try:
            while not self._stop.is_set():
                data = child.read_exact(chunk_bytes, _CAPTURE_READ_TIMEOUT_S)
                if data is None:
                    if self._stop.is_set():
                        break
                    raise EdgeAgentError(
                        f"audio capture from ALSA device {device!r}: arecord {child.failure}"
                    )
                if not streamed:
                    # Not quiet (-q), so that a card which cannot record at this rate says so.
                    warning = child.said("rate is not accurate")  # "(requested = 16000Hz, got = 48000Hz)"
                    if warning:
                        raise EdgeAgentError(
                            f"ALSA device {device!r} cannot record at {rate} Hz ({warning}): "
                            f"use plughw:{device.removeprefix('hw:')} or default, which convert the rate"
                        )
                    streamed = True
                    self._set_state("streaming")
                    log.info("source %s: capturing from ALSA device %s at %d Hz", self.name, device, rate)
                before = windows.index
                samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
                windows.add(samples, captured_at=time.time())
                with self._lock:
                    self.windows += windows.index - before
        finally:
            child.close()
        return windows.index, streamed

    def _play(self, audio: np.ndarray, index: int) -> int:
        """Hand every full window of `audio` to the queue; returns the next window index."""
        rate, window = self.config.sample_rate, self.config.window
        self._set_state("streaming")
        started = time.monotonic()
        first = True
        for start, chunk in audio_windows(audio, window, self.hop):
            if self._stop.is_set():
                break
            if self.config.realtime:  # a window is there once its last sample would have been heard
                due = started + (start + window) / rate
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    break
            index += 1
            frame = Frame(
                data=chunk, index=index, captured_at=time.time(), position_s=start / rate, gap=first
            )
            self.slot.put(frame)
            first = False
            with self._lock:
                self.windows += 1
        return index
