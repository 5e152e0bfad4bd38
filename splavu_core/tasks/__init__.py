"""What a utility task is, shared by the AAM's fit and by evaluation: in-memory features, task heads, metrics."""
