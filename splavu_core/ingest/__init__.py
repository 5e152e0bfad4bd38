"""Stage 1, videos in: manifests, registered datasets, video I/O, person masks, and the synthetic benchmark."""
