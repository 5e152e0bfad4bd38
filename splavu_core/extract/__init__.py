"""Stage 2, frozen encoder: clip sampling, the encoders, pixel transforms, and shard extraction into raw latents."""
