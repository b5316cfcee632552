"""Facts about cached datasets: the listing, summaries and statistics, normalized scores, TED
checks and plots."""
