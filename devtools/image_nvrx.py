"""`python -m devtools.image_nvrx`: put the image's NVRx release into this machine's venv.

The GPU image runs NVRx 0.7 (`config.versions.DEFAULT_NVRX_VERSION`), whose only wheels are for
Python 3.12 and glibc 2.39; the CPU machines have Python 3.11 and glibc 2.36, where pip installs
nothing newer than 0.4.1. NVRx is Python but for one optional extension (the straggler
detector's CUPTI module, which the trainer never imports), so the wheel's files are unpacked
into the venv as pip would install them, after its SHA-256 is checked against the pin below.
`make test`'s image leg tests the trainer on these modules (docs/testing.md says what that
covers and what it cannot: compiled parts).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from config.versions import DEFAULT_NVRX_VERSION

# The wheel pip downloads for the image's release, and its digest (PyPI's, checked on download).
WHEELS = {
    "0.7.0": ("nvidia_resiliency_ext-0.7.0-cp312-cp312-manylinux_2_39_x86_64.whl",
              "e0c646ccae211de81a4c2b5bb5cff96a5e12af1373fb0eb818a40716eef685ad"),
}
DIST = "nvidia_resiliency_ext"


class WheelError(RuntimeError):
    """The pinned wheel could not be fetched, or its digest differs."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(version: str, into: Path) -> Path:
    """The pinned wheel of `version` in `into` (a cached copy when its digest matches)."""
    if version not in WHEELS:
        raise WheelError(f"no pinned wheel for NVRx {version}; pinned: {', '.join(WHEELS)}")
    name, digest = WHEELS[version]
    wheel = into / name
    if not (wheel.is_file() and sha256(wheel) == digest):
        into.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                        "cp", "--platform", "manylinux_2_39_x86_64", "-d", str(into),
                        f"nvidia-resiliency-ext=={version}"], check=True)
    if not wheel.is_file():
        raise WheelError(f"pip did not download {name}")
    if sha256(wheel) != digest:
        raise WheelError(f"{wheel}: sha256 {sha256(wheel)} is not the pinned {digest}")
    return wheel


def remove_installed(site: Path) -> None:
    """Remove every installed NVRx release, by the files its dist-info's RECORD lists."""
    for info in site.glob(f"{DIST}-*.dist-info"):
        record = info / "RECORD"
        if record.is_file():
            for line in record.read_text().splitlines():
                path = site / line.split(",")[0]
                if path.is_file():
                    path.unlink()
        shutil.rmtree(info, ignore_errors=True)
    shutil.rmtree(site / DIST, ignore_errors=True)


def install(version: str, site: Path, cache: Path) -> Path:
    """Unpack the pinned wheel of `version` into `site` in place of any installed release."""
    wheel = download(version, cache)
    remove_installed(site)
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory(dir=site) as tmp:
        archive.extractall(tmp)
        for entry in Path(tmp).iterdir():
            shutil.move(str(entry), str(site / entry.name))
    return wheel


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.image_nvrx", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=DEFAULT_NVRX_VERSION,
                        help=f"the NVRx release (default: the image's, {DEFAULT_NVRX_VERSION})")
    parser.add_argument("--cache", type=Path, default=Path(".cache/wheels"),
                        help="where the downloaded wheel is kept")
    args = parser.parse_args()
    if args.version not in WHEELS:
        print(f"devtools.image_nvrx: error: --version {args.version}: no pinned wheel; "
              f"allowed: {', '.join(WHEELS)}", file=sys.stderr)
        return 2
    site = Path(sysconfig.get_paths()["purelib"])
    try:
        wheel = install(args.version, site, args.cache)
    except (WheelError, subprocess.CalledProcessError) as exc:
        print(f"devtools.image_nvrx: error: {exc}", file=sys.stderr)
        return 1
    print(f"NVRx {args.version} from {wheel.name} (sha256 checked) in {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
