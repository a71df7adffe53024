"""LG140 remote-adapter-unreadable: its catalogue entry (message templates, fixes, docs)."""

from lora_guard._core.catalogue._invariant import entry

ENTRY = entry(
    code="LG140",
    slug="remote-adapter-unreadable",
    title="A remote adapter that could not be fetched",
    summary=(
        "An adapter named by URL (`hf://ORG/REPO[@REV][/SUB]`, a bare Hub id `ORG/NAME`, "
        "`s3://BUCKET/PREFIX`, `https://...`) is checked from ranged reads of its "
        "`adapter_config.json` and safetensors header (credentials from huggingface_hub and "
        "botocore), each read within a total deadline. When the object is missing, access "
        "is denied, a read comes back short, a redirect leads to another host, or the store "
        "stays unreachable after the retries or past the deadline, that adapter is reported "
        "with the reason and the rest of the run goes on. What the files hold, once read, "
        "is checked as for a local adapter (LG108 for a bad header)."
    ),
    triggers=(
        "A URL, bucket, key, repo, revision or subfolder that does not exist.",
        "Credentials missing, expired or without read access (HTTP 401/403, S3 AccessDenied, "
        "a gated or private Hub repo).",
        "A read that returned fewer bytes than asked, or an object that changed size between "
        "the listing and the read.",
        "An HTTP(S) redirect to another host.",
        "Timeouts, throttling (429, SlowDown) or server errors that outlast the retries.",
    ),
    situations=(
        "A typo in a prefix or repo id; a bare `ORG/NAME` meant as a local folder that is "
        "not there (it is then read from the Hub).",
        "A CI job whose role or token cannot read the adapters' bucket or repo.",
        "An upload still in progress while the check runs.",
    ),
    fixes=(
        "Check the URL: bucket and prefix, repo id, revision and subfolder (list it with "
        "`aws s3 ls` or `hf download --dry-run`); a local folder needs a path that exists.",
        "Give the library its usual credentials: AWS_PROFILE or AWS_ACCESS_KEY_ID/"
        "AWS_SECRET_ACCESS_KEY (or an instance role) for S3, HF_TOKEN or `hf auth login` for "
        "the Hub, and check they may read this object.",
        "Run the check again once the upload is complete; if the read stays short, upload "
        "the adapter again.",
        "Name the final URL: a redirect to another host is not followed.",
        "Retry later, or raise LORA_GUARD_REMOTE_TIMEOUT / LORA_GUARD_REMOTE_DEADLINE / "
        "LORA_GUARD_REMOTE_RETRIES; lower "
        "LORA_GUARD_REMOTE_WORKERS if the store throttles.",
    ),
    example=(
        '# lora-guard check says:\n'
        "# LG140 remote-adapter-unreadable: adapter 's3://my-bucket/loras/math':\n"
        '# adapter_config.json: access denied (HTTP 403).\n'
        "lora-guard check s3://my-bucket/loras/ hf://my-org/math-lora@v2\n"
        "AWS_PROFILE=reader lora-guard check s3://my-bucket/loras/   # the credentials "
        "that may read it\n"
    ),
    error="AdapterError",
    messages={
        "not-found": "{subject}: {file}: {problem}.",
        "denied": "{subject}: {file}: {problem}.",
        "truncated": "{subject}: {file}: {problem}.",
        "redirect": "{subject}: {file}: {problem}.",
        "unreachable": "{subject}: {file}: {problem}.",
    },
    variant_fixes={"denied": 1, "truncated": 2, "redirect": 3, "unreachable": 4},
    raised_by=("lg.inspect_adapter", "lg.check_adapters", "lora-guard check"),
)
