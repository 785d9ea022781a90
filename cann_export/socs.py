"""ATC's SoC names (``--soc-version``): their shape, the names ATC releases know, each one's float overflow mode
(what device-precision parity emulates) and the checks an export and validate run on a name before any work."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from .errors import OptionsError

# The shape of an ATC --soc_version: bundle.rederive checks a manifest's soc_version against the same pattern,
# so an export never writes a bundle its own validate refuses.
SOC_PATTERN = re.compile(r"Ascend\d{3}[A-Za-z0-9_]{0,12}")
# SoC names ATC releases accept (their soc_version; the 310P3vir* names are its vNPU splits). An export refuses
# any other name, with the closest of these (``check_known_soc``), unless allow_unknown_soc (--allow-unknown-soc)
# lets a SoC newer than this list through with a recorded warning.
KNOWN_SOCS = (
    "Ascend310", "Ascend310B1", "Ascend310B2", "Ascend310B3", "Ascend310B4", "Ascend310P1", "Ascend310P2",
    "Ascend310P3", "Ascend310P4", "Ascend310P5", "Ascend310P7",
    "Ascend310P3vir01", "Ascend310P3vir02", "Ascend310P3vir04", "Ascend310P3vir08",
    "Ascend610", "Ascend910", "Ascend910A", "Ascend910B", "Ascend910B1", "Ascend910B2", "Ascend910B2C",
    "Ascend910B3", "Ascend910B4", "Ascend910B4_1", "Ascend910ProA", "Ascend910ProB", "Ascend910PremiumA",
    "Ascend910_9391", "Ascend910_9392", "Ascend910_9381", "Ascend910_9382", "Ascend910_9372", "Ascend910_9362",
)
# The float overflow mode of a SoC's AI cores (what an fp16/bf16 result past its range becomes on the device):
# - "saturation": past +-65504 a value becomes +-65504 and NaN becomes 0 (the runtime's aclrtFloatOverflowMode /
#   INF_NAN_MODE_ENABLE pages: "saturation mode: Inf set to max, NaN set to 0"); Atlas inference (310, 310P),
#   Atlas 200I/500 A2 (310B) and Atlas training (910, 910A, 910ProA/B, 910PremiumA) support only this mode;
# - "inf_nan": IEEE 754 (past 65504 is inf), the default and recommended mode of Atlas A2 (910B1..B4) and A3
#   (910_93xx): torch_npu's IsSupportInfNan() grants it to Ascend910B1 <= soc < Ascend310B1 and to Ascend910_9391
#   and later, so the older plain "Ascend910B" (listed before Ascend310P1 in its SocVersion enum) saturates.
SATURATION, INF_NAN = "saturation", "inf_nan"
OVERFLOW_MODES = (SATURATION, INF_NAN)
INF_NAN_SOCS = re.compile(r"Ascend910B\d[A-Za-z0-9_]*|Ascend910_93\d*")
SOC_OVERFLOW = {soc: INF_NAN if INF_NAN_SOCS.fullmatch(soc) else SATURATION for soc in KNOWN_SOCS}


@dataclass(frozen=True)
class SocModel:
    """What the device-precision emulation models of one SoC: its overflow mode, and whether the SoC is one this
    tool knows (an unknown name of the right shape is assumed by its family: 910B<digit>* and 910_93* compute in
    Inf/NaN mode, every other name saturates, the mode of every inference SoC)."""

    soc: str
    overflow: str
    known: bool

    @property
    def note(self) -> str | None:
        if self.known:
            return None
        family = "an Atlas A2/A3 name" if self.overflow == INF_NAN else "the mode of every SoC but 910B<n>*/910_93*"
        return (f"{self.soc} is not a SoC this tool knows; its float overflow mode is assumed to be {self.overflow} "
                f"({family}); pass a known name (options.KNOWN_SOCS) to be sure")

    def to_dict(self) -> dict[str, Any]:
        return {"soc_version": self.soc, "overflow_mode": self.overflow, "known": self.known,
                **({"note": self.note} if self.note else {})}


def soc_model(soc: str) -> SocModel:
    """The device model of ``soc`` (checked with ``check_soc_version``)."""
    soc = check_soc_version(soc)
    if soc in SOC_OVERFLOW:
        return SocModel(soc, SOC_OVERFLOW[soc], True)
    return SocModel(soc, INF_NAN if INF_NAN_SOCS.fullmatch(soc) else SATURATION, False)


def check_soc_version(value: Any, flag: str = "--soc-version") -> str:
    """``value`` when it is an Ascend SoC name (``SOC_PATTERN``), else an OptionsError suggesting the closest
    known SoC."""
    if isinstance(value, str) and SOC_PATTERN.fullmatch(value):
        return value
    text = value if isinstance(value, str) else str(value)
    word = text.split()[0] if text.split() else text
    lowered = {soc.lower(): soc for soc in KNOWN_SOCS}
    close = difflib.get_close_matches(word.lower(), lowered, n=1, cutoff=0.4)
    hint = f"did you mean {lowered[close[0]]}? " if close else ""
    raise OptionsError(f"{flag} {value!r} is not an Ascend SoC name (pattern {SOC_PATTERN.pattern}, e.g. Ascend310P3 "
                       f"or Ascend910B); {hint}pass the name ATC knows for the target chip, one word with no spaces "
                       f"or options (known: {', '.join(KNOWN_SOCS)})")


def check_known_soc(soc: str, allow_unknown: bool, flag: str = "--soc-version") -> str | None:
    """Refuse a SoC name of the right shape that ATC has no target for (Ascend310P, Ascend310P9), naming the
    closest known one; with ``allow_unknown`` (a SoC newer than KNOWN_SOCS) return the warning to record instead."""
    if soc in KNOWN_SOCS:
        return None
    names = {known.lower(): known for known in KNOWN_SOCS}
    longer = [known for low, known in names.items() if low.startswith(soc.lower())]  # Ascend310P: which one?
    close = longer or [names[c] for c in difflib.get_close_matches(soc.lower(), names, n=3, cutoff=0.6)]
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    if allow_unknown:
        return (f"{flag} {soc} is not a SoC this tool knows ({hint}let through by --allow-unknown-soc): ATC decides "
                "whether it has that target")
    raise OptionsError(f"{flag} {soc!r} is not a SoC ATC knows; {hint}pass the soc_version of the target chip "
                       f"(Ascend + the Name `npu-smi info` shows; known: {', '.join(KNOWN_SOCS)}), or "
                       "--allow-unknown-soc for a SoC newer than this list")
