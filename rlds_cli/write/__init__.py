"""The write path of growing datasets: :class:`~rlds_cli.write.writer.DatasetWriter` (validate,
commit segments, evict) and :func:`~rlds_cli.write.compact.compact` (merge segments)."""
