"""The recovery layers around the loop: in-process restart, heartbeats, the launcher (torchrun or
ft_launcher) and its forked workers, and NVRx version differences."""
