"""FSDP2 LLaMA training that keeps GPUs productive through failures."""

import warnings

# torch.cuda warns about the pynvml module that NVRx's dependency nvidia-ml-py provides.
warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
