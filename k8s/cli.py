"""`python -m k8s synth`: profile + CDK outputs -> manifests in --outdir.

Every input problem ends as one line on stderr naming the key, and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from config import MODE_NAMES, Profile, ProfileError, load_profile
from config.training import settings_lines
from k8s import synth
from k8s.deployment import Deployment, resolve
from k8s.errors import SynthError
from k8s.outputs import default_outputs_path, load_outputs

PROG = "python -m k8s"


def add_deployment_args(parser: argparse.ArgumentParser) -> None:
    """Options shared with the wrapper, so both accept the same spelling."""
    parser.add_argument("--profile", required=True, help="profile name in config/profiles, or a YAML path")
    parser.add_argument("--mode", choices=MODE_NAMES, help="recovery mode (default: the profile's)")
    parser.add_argument(
        "--outputs",
        help="CDK outputs file (default: ./cdk-outputs.json when it exists)",
    )
    parser.add_argument("--run_id", help="run directory and object names (default: <mode>-<UTC time>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one profile value for this run, validated as the file is "
                        "(repeatable): --set trainer.compile=true --set data.tokenizer=byte")
    add_image_tag_arg(parser)


def add_image_tag_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image_tag", help="trainer image tag in the stack's ECR repository "
                        "(default: the profile's image_tag, else the git commit, which `make image` "
                        "pushes; never latest)")


def profile_from_args(args: argparse.Namespace) -> Profile:
    """The named profile, with the --set and --image_tag overrides applied."""
    profile = load_profile(args.profile, getattr(args, "overrides", ()))
    if getattr(args, "image_tag", None):
        profile = profile.model_copy(update={"image_tag": args.image_tag})
    return profile


def deployment_from_args(args: argparse.Namespace) -> Deployment:
    """Profile + outputs + flags -> Deployment; raises SynthError/ProfileError on bad input."""
    profile = profile_from_args(args)
    outputs_path: Path | str | None = args.outputs or default_outputs_path()
    return resolve(
        profile,
        load_outputs(outputs_path),
        mode=args.mode,
        run_id=args.run_id,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    synth_cmd = sub.add_parser("synth", help="write the manifests of one profile and mode")
    add_deployment_args(synth_cmd)
    synth_cmd.add_argument("--outdir", default="dist", type=Path, help="where the YAML files go")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        dep = deployment_from_args(args)
        paths = synth.write(synth.build(dep), args.outdir)
    except (SynthError, ProfileError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return SynthError.exit_code
    print(f"run {dep.run_id} ({dep.mode}, {dep.profile.node_count}x {dep.profile.instance_type})")
    for line in settings_lines(dep.train):
        print(f"  trainer {line}")
    for path in paths:
        print(path)
    return 0
