"""The block-diffusion loop: one run or a batch of lanes, the schedulers, and the step fused on the device."""
