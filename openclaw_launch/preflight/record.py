"""``preflight --record FILE`` and ``--expect FILE``: the measured bandwidths saved with what makes
them comparable (message size, ranks, GPUs by UUID), read back with every value checked, and
compared with this run before anything is measured. Pure: the file is read by the bounded reader
(safe_read.read_json) in command.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.preflight.decide import Floors
from openclaw_launch.preflight.tiers import RECORDED_MARGIN, Tier
from openclaw_launch.report.preflight import PreflightDecision, PreflightTier

RECORD_FORMAT = "openclaw-preflight-record/1"


def _tier_gpus(ranks: Sequence[int], plan: LaunchPlan) -> tuple[str, ...]:
    members = set(ranks)
    return tuple(sorted({r.gpu_uuid for r in plan.ranks if r.rank in members and r.gpu_uuid}))


@dataclass(frozen=True)
class RecordedTier:
    busbw_gbps: float
    size_bytes: int | None  # None: not recorded (older files); the others too
    ranks: int | None
    gpus: tuple[str, ...] | None


@dataclass(frozen=True)
class RecordedPair:
    busbw_gbps: float
    size_bytes: int | None  # None: not recorded (older files); ranks too
    ranks: int | None


@dataclass(frozen=True)
class RecordedGemm:
    tflops: float
    n: int | None  # None: not recorded (older files); dtype too
    dtype: str | None


@dataclass(frozen=True)
class Recording:
    """A ``--record`` file: written through the codec, read back with its values checked
    (``gemm`` and ``pairs``: empty in older files)."""

    format: str
    node: str | None
    tiers: Mapping[str, RecordedTier]
    gemm: Mapping[str, RecordedGemm]
    pairs: Mapping[str, RecordedPair]


def record(results: Sequence[PreflightTier], plan: LaunchPlan, decision: PreflightDecision | None) -> Recording:
    """``--record FILE``: the measured bandwidths, for a later ``--expect FILE``, with what makes them
    comparable: the message size, the ranks and the GPUs (by UUID) of each tier; each GEMM's TFLOPS
    (by GPU UUID, or node and local rank) with its size; each node pair's bandwidth with its size."""
    gemm = decision.gemm if decision else ()
    pairs = decision.pairs if decision else ()
    return Recording(
        format=RECORD_FORMAT,
        node=plan.node,
        tiers={
            r.name: RecordedTier(r.busbw_gbps, r.size_bytes, len(r.ranks), _tier_gpus(r.ranks, plan))
            for r in results
            if r.busbw_gbps is not None
        },
        gemm={g.gpu_uuid or f"{g.node}/local_rank={g.local_rank}": RecordedGemm(g.tflops, g.n, g.dtype) for g in gemm},
        pairs={
            p.name: RecordedPair(p.busbw_gbps, p.size_bytes, len(p.ranks)) for p in pairs if p.busbw_gbps is not None
        },
    )


def _number(value: Any, integer: bool) -> bool:
    """A finite number > 0 (not a boolean, which Python counts as an int)."""
    kinds = (int,) if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and 0 < value < float("inf")


def recorded_floors(data: Any) -> Recording:
    """The tiers of a ``--record`` file's JSON; ValueError says what is wrong with it."""
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT or not isinstance(data.get("tiers"), dict):
        raise ValueError(f"not a preflight recording (format {RECORD_FORMAT}; write one with --record)")
    tiers = {}
    for name, entry in data["tiers"].items():
        entry = entry if isinstance(entry, dict) else {}
        if not _number(entry.get("busbw_gbps"), integer=False):
            raise ValueError(f"tiers.{name}.busbw_gbps is {entry.get('busbw_gbps')!r}, not a bandwidth > 0 in GB/s")
        for key in ("size_bytes", "ranks"):
            if key in entry and not _number(entry[key], integer=True):
                raise ValueError(f"tiers.{name}.{key} is {entry[key]!r}, not a whole number > 0")
        gpus = entry.get("gpus")
        if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus)):
            raise ValueError(f"tiers.{name}.gpus is not a list of GPU UUIDs")
        uuids = None if gpus is None else tuple(gpus)
        tiers[str(name)] = RecordedTier(float(entry["busbw_gbps"]), entry.get("size_bytes"), entry.get("ranks"), uuids)
    gemm = {}
    for key, entry in _section(data, "gemm").items():
        if not _number(entry.get("tflops"), integer=False):
            raise ValueError(f"gemm.{key}.tflops is {entry.get('tflops')!r}, not a throughput > 0 in TFLOPS")
        if "n" in entry and not _number(entry["n"], integer=True):
            raise ValueError(f"gemm.{key}.n is {entry['n']!r}, not a whole number > 0")
        if "dtype" in entry and not isinstance(entry["dtype"], str):
            raise ValueError(f"gemm.{key}.dtype is {entry['dtype']!r}, not a type name such as bfloat16")
        gemm[str(key)] = RecordedGemm(float(entry["tflops"]), entry.get("n"), entry.get("dtype"))
    pairs = {}
    for name, entry in _section(data, "pairs").items():
        if not _number(entry.get("busbw_gbps"), integer=False):
            raise ValueError(f"pairs.{name}.busbw_gbps is {entry.get('busbw_gbps')!r}, not a bandwidth > 0 in GB/s")
        for key in ("size_bytes", "ranks"):
            if key in entry and not _number(entry[key], integer=True):
                raise ValueError(f"pairs.{name}.{key} is {entry[key]!r}, not a whole number > 0")
        pairs[str(name)] = RecordedPair(float(entry["busbw_gbps"]), entry.get("size_bytes"), entry.get("ranks"))
    node = data.get("node")
    return Recording(RECORD_FORMAT, node if isinstance(node, str) else None, tiers, gemm, pairs)


def _section(data: Mapping[str, Any], key: str) -> dict[str, dict[str, Any]]:
    """``gemm`` or ``pairs`` of a recording: absent is empty; each entry an object."""
    section = data.get(key, {})
    if not isinstance(section, dict):
        raise ValueError(f"{key} is not an object")
    return {str(k): v if isinstance(v, dict) else {} for k, v in section.items()}


def decision_floors(recording: Recording, source: str, gemm_n: int, size_bytes: int) -> tuple[Floors, list[str]]:
    """``--expect``'s floors for the GEMMs and the node pairs (recorded x RECORDED_MARGIN), and a
    warning for each recorded with another size (not used). Which GPUs and pairs this run has is
    known once measured: a recorded one this run lacks is not used."""
    warnings = []
    gemm = {}
    for key, g in recording.gemm.items():
        if g.n is not None and g.n != gemm_n:
            warnings.append(f"--expect {source}: GEMM {key} recorded with n={g.n}, this run uses n={gemm_n}; not used")
        else:
            gemm[key] = round(g.tflops * RECORDED_MARGIN, 4)
    pairs = {}
    for name, p in recording.pairs.items():
        if p.size_bytes is not None and p.size_bytes != size_bytes:
            warnings.append(
                f"--expect {source}: {name} recorded with {p.size_bytes / 2**20:g} MiB all-reduces, this run uses "
                f"{size_bytes / 2**20:g} MiB; not used"
            )
        else:
            pairs[name] = round(p.busbw_gbps * RECORDED_MARGIN, 4)
    return Floors(gemm, pairs), warnings


def usable_floors(
    recording: Recording, source: str, tiers: Sequence[Tier], plan: LaunchPlan, size_bytes: int
) -> tuple[dict[str, float], list[str]]:
    """The recorded bandwidths that compare with this run, and a warning for each that does not (another
    message size, other ranks or GPUs: not used). ValueError when no tier of the recording is in this
    run: a recording of another topology."""
    names = {t.name for t in tiers}
    if recording.tiers and not names & set(recording.tiers):
        raise ValueError(
            f"{source} recorded tier(s) {', '.join(sorted(recording.tiers))}; this run has "
            f"{', '.join(sorted(names)) or 'none'}: a recording of another topology (make one here with --record)"
        )
    warnings = []
    if recording.node is not None and recording.node != plan.node:
        warnings.append(f"--expect {source} was recorded on node {recording.node}; this is {plan.node}")
    floors = {}
    for t in tiers:
        rec = recording.tiers.get(t.name)
        if rec is None:
            continue
        why = None
        if rec.size_bytes is not None and rec.size_bytes != size_bytes:
            why = (
                f"recorded with {rec.size_bytes / 2**20:g} MiB all-reduces, this run uses {size_bytes / 2**20:g} MiB "
                f"(bandwidth depends on the size: pass --size-mib {rec.size_bytes / 2**20:g})"
            )
        elif rec.ranks is not None and rec.ranks != len(t.ranks):
            why = f"recorded with {rec.ranks} ranks, this run has {len(t.ranks)}"
        elif rec.gpus is not None and rec.gpus != _tier_gpus(t.ranks, plan):
            why = "recorded on other GPUs (UUIDs differ)"
        if why is None:
            floors[t.name] = rec.busbw_gbps
        else:
            warnings.append(f"--expect {source}: tier {t.name} {why}; its recorded bandwidth is not used")
    warnings += [
        f"--expect {source}: tier {name} is not in this run; ignored" for name in sorted(set(recording.tiers) - names)
    ]
    return floors, warnings
