"""S3 clients for the object stores, built from a data centre's endpoint (``stores.<dc>``), that any
S3-compatible store accepts.

Example::

    from purger.config import load_config
    from purger.connectors import s3_client
    config = load_config()
    store = config.stores["dc1"]
    s3 = s3_client(store)
    s3.delete_objects(Bucket=store.bucket, Delete={"Objects": [{"Key": "m1"}]})
"""

from __future__ import annotations

from typing import Any

from purger.core.settings import S3Endpoint


def s3_client(config: S3Endpoint, attempts: int = 3, read_timeout_s: float = 30):  # -> botocore S3 client
    """``attempts`` and ``read_timeout_s`` bound how long a store that does not answer holds a call."""
    import boto3
    from botocore.config import Config

    keys = {}
    if config.credentials == "keys":
        keys = {"aws_access_key_id": config.access_key, "aws_secret_access_key": config.secret_key.get_secret_value()}
    client = boto3.client(
        "s3",
        endpoint_url=config.endpoint,
        **keys,  # or else boto3's own chain: AWS_* variables, ~/.aws, an instance or pod role
        region_name=config.region,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": attempts, "mode": "standard"},
            connect_timeout=5,
            read_timeout=read_timeout_s,
            # Not every S3-compatible store accepts the newer default checksum headers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    client.meta.events.register("before-sign.s3.DeleteObjects", _content_md5)
    return client


def _content_md5(request: Any, **_: Any) -> None:
    """A multi-object delete checksummed by ``Content-MD5``, which S3 and the S3-compatible stores all accept,
    instead of the CRC32 headers botocore sends since 1.36, which some refuse (S3Proxy: "NotImplemented")."""
    import base64
    import hashlib

    for header in [h for h in request.headers if h.lower().startswith("x-amz-checksum-")
                   or h.lower() == "x-amz-sdk-checksum-algorithm"]:
        del request.headers[header]
    request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(request.body).digest()).decode()
