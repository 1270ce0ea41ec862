"""One construct per concern; stacks in `infra.stacks` only compose these."""
