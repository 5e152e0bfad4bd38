"""Evaluation: metrics on numpy arrays (`metrics`) and the paper's protocols on VideoFeatures (`probes`).

Only the metrics are re-exported here: `protocols` pulls in torch, import it explicitly.
"""
from .metrics import (TIOUS, average_precision, chance_cmap, cmap, cmap_resamples, frame_auc, frame_labels, frame_scores, interpolated_ap, macro_f1,
                      segment_iou, tad_map, top1)

__all__ = ["TIOUS", "average_precision", "chance_cmap", "cmap", "cmap_resamples", "frame_auc", "frame_labels", "frame_scores", "interpolated_ap",
           "macro_f1", "segment_iou", "tad_map", "top1"]
