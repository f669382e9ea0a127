"""A real S3 server on 127.0.0.1 for the object-storage tests: moto's standalone server (as
s3fs's own tests use), started with bounded waits and killed on the way out.

The server checks credentials (``INITIAL_NO_AUTH_ACTION_COUNT``: the first requests, which make
the user, its key and its policy, go unchecked; every later one is signed with a key the server
knows or refused), so a wrong key is refused as a real S3 refuses it. ``env`` is what a process
needs to reach the bucket the way users configure it: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from distributed.helpers import free_port

#: the requests made before the server checks credentials: the user, its access key, its policy
UNCHECKED_REQUESTS = 3


class S3Server:
    """``python -m moto.server`` on a free port of 127.0.0.1, with one user allowed everything."""

    def __init__(self, log: Path, start_timeout: float = 30.0) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log, self.start_timeout = log, start_timeout
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] = {}

    def start(self) -> S3Server:
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(UNCHECKED_REQUESTS)}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                             str(self.port)], stdout=out, stderr=subprocess.STDOUT, env=env)
        end = time.monotonic() + self.start_timeout
        while True:
            assert self.process.poll() is None, f"moto server ended: {self.log.read_text()[-2000:]}"
            assert time.monotonic() < end, f"moto server not up after {self.start_timeout} s: {self.log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1", **self._user()}
        return self

    def _user(self) -> dict[str, str]:
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1",
                           aws_access_key_id="unchecked", aws_secret_access_key="unchecked")
        iam.create_user(UserName="fw")
        key = iam.create_access_key(UserName="fw")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="fw", PolicyName="everything", PolicyDocument=json.dumps(policy))
        return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}

    def filesystem(self):
        """An ``s3fs.S3FileSystem`` of this server with the user's key (not fw's: the tests look
        at the bucket on their own)."""
        import s3fs

        return s3fs.S3FileSystem(key=self.env["AWS_ACCESS_KEY_ID"], secret=self.env["AWS_SECRET_ACCESS_KEY"],
                                 endpoint_url=self.endpoint, skip_instance_cache=True)

    def client(self):
        """A boto3 S3 client of this server with the user's key (what s3fs does not show, such as
        the multipart uploads that were never completed)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
