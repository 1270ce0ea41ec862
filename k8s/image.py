"""The trainer image of a run, named so that it cannot move.

Every node of a run, and every pod that replaces one, must run the same bits. So the image is
named by a digest, or by a tag that is never pushed twice: by default the git commit, which
`make image` pushes into the stack's ECR repository, whose tags are immutable. `latest`, or a
reference with neither tag nor digest, is refused at synthesis.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from config import Profile
from k8s import outputs
from k8s.errors import SynthError
from k8s.outputs import StackOutputs

REPO = Path(__file__).resolve().parents[1]
MOVING_TAG = "latest"
COMMIT_TAG_LENGTH = 12
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class TrainerImage:
    """The image every container of a run uses, and where it comes from."""

    reference: str  # registry/repository[:tag][@sha256:...]
    in_stack_repository: bool  # the stack's ECR repository, whose tags never move

    @property
    def digest(self) -> str | None:
        return split(self.reference)[2]

    @property
    def immutable(self) -> bool:
        """A digest names one image; so does any tag of the stack's repository."""
        return self.digest is not None or self.in_stack_repository

    @property
    def pull_policy(self) -> str:
        """IfNotPresent where the reference cannot move, so a replacement pod never waits on the
        registry; Always elsewhere, so a node's cached copy never hides a tag pushed again."""
        return "IfNotPresent" if self.immutable else "Always"


def split(reference: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of `registry[:port]/path[:tag][@digest]`."""
    name, _, digest = reference.partition("@")
    head, _, last = name.rpartition("/")
    repository_last, _, tag = last.partition(":")
    repository = f"{head}/{repository_last}" if head else repository_last
    return repository, tag or None, digest or None


def check_tag(tag: str) -> str:
    """A tag Docker accepts, and one that names a single image."""
    if not _TAG.fullmatch(tag):
        raise SynthError(
            f"image tag {tag!r} is not a tag (letters, digits, '_', '.' and '-', at most 128, "
            "not starting with '.' or '-')"
        )
    if tag == MOVING_TAG:
        raise SynthError(
            f"image tag {tag!r} moves with every push: name the image by an immutable tag "
            "(`make image` pushes the git commit, the default) or by a digest (image: <repository>@sha256:...)"
        )
    return tag


def check_reference(reference: str) -> str:
    """A full image reference (the profile's `image`) with a digest, or an immutable tag."""
    _, tag, digest = split(reference)
    if digest is not None:
        if not _DIGEST.fullmatch(digest):
            raise SynthError(f"image {reference!r}: the digest must be 'sha256:' and 64 lowercase hex digits")
        return reference
    if tag is None:
        raise SynthError(f"image {reference!r} names no tag: add an immutable tag, or a digest (@sha256:...)")
    check_tag(tag)
    return reference


def commit_tag(repo: Path = REPO) -> str:
    """The checkout's commit, abbreviated as `make image` tags the image it pushes."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", f"--short={COMMIT_TAG_LENGTH}", "HEAD"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    else:
        if proc.returncode == 0:
            return proc.stdout.strip()
        why = (proc.stderr.strip().splitlines() or ["git failed"])[-1]
    raise SynthError(
        f"no git commit to name the trainer image by ({why}): pass --image_tag with the tag you "
        "pushed, or set image_tag or image in the profile"
    )


def trainer_image(profile: Profile, out: StackOutputs) -> TrainerImage:
    """The profile's `image`, else the stack's repository at `image_tag`, else at the commit."""
    stack_repository = out.get(outputs.ECR_REPOSITORY_URI)
    if profile.image:
        reference = check_reference(profile.image)
        return TrainerImage(reference, split(reference)[0] == stack_repository)
    repository = out.require(outputs.ECR_REPOSITORY_URI, "the profile sets no image")
    tag = check_tag(profile.image_tag) if profile.image_tag else commit_tag()
    return TrainerImage(f"{repository}:{tag}", in_stack_repository=True)


def checkov_skips(image: TrainerImage) -> list[tuple[str, str]]:
    """Why a tag of the stack's repository stands for a digest. Elsewhere checkov's findings
    stand: a tag in another registry may move."""
    if image.digest is not None or not image.in_stack_repository:
        return []
    immutable = "the tag is one of the stack's ECR repository, whose tags are immutable"
    return [
        ("CKV_K8S_43", f"No digest: {immutable}, so it names one image as a digest would"),
        ("CKV_K8S_15", f"Pull policy IfNotPresent: {immutable}, so a node's cached copy is the "
                       "pushed image and a replacement pod starts without a registry round trip"),
    ]
