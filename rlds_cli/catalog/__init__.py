"""Names and records: the dataset registry, what a name refers to, and the environments datasets
were recorded in."""
