"""LoRA subtraction (Liu & Chang, CVPR 2025): each task's LoRA learns in the drift-resistant space, the
inputs of the network without the earlier tasks' LoRAs; prediction by class means."""
