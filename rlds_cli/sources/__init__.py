"""Where datasets come from: download by id, URL or path (the Hub included), conversion into
the cache, and verification against the sources."""
