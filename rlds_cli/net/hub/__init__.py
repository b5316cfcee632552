"""``hf://datasets/ORG/REPO[/PATH][@REVISION]``: Hugging Face Hub dataset repos, through
``huggingface_hub`` (endpoints, tokens, pagination, Xet storage, retries), with rlds's own
guarantees kept on top: every LFS file checked against the sha256 the Hub publishes, resumed
downloads, atomic placement inside the cache's download folder, and tokens never recorded.
"""
