"""Facts about cached datasets: listing, summaries, normalized scores, TED checks, audits, viewer."""
