"""A real S3-compatible server (moto's standalone server) on loopback for the zoo tests."""
from __future__ import annotations

import os
import uuid


class LoopbackS3:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        _, port = self.server.get_host_and_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        self.bucket = "zoo-tests"
        self.client.create_bucket(Bucket=self.bucket)

    def new_zoo(self) -> str:
        return f"s3://{self.bucket}/{uuid.uuid4().hex[:10]}?endpoint_url={self.endpoint}"

    def close(self) -> None:
        self.server.stop()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
