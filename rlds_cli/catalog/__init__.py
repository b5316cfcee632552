"""Names: the dataset registry (and what its entries declare: files, options, the environment
a D4RL entry names) and what a name refers to."""
