"""Our implementations run side by side with their authors' code on the same weights and batches
(``python -m benchmarks.investigations.side_by_side.<method> --authors-code PATH``): the authors' repository is imported
from an extracted copy at PATH, never copied into this project."""
