"""Reads every Capture file (.avro) under a local directory or an S3 prefix with fastavro
and prints one JSON line per record: the file's path (relative to the directory or
prefix) and the record's fields; bytes values (the body, bytes properties) as base64.

    read_capture.py DIR
    read_capture.py s3://BUCKET/PREFIX ENDPOINT     (credentials from AWS_* variables)
"""

import base64
import io
import json
import os
import sys

import fastavro


def jsonable(value):
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    raise TypeError(f"cannot write {type(value)} as JSON")


def print_records(path, data):
    for record in fastavro.reader(io.BytesIO(data)):
        record = dict(record)
        body = record["Body"]
        record["Body"] = None if body is None else base64.b64encode(body).decode()
        record["path"] = path
        print(json.dumps(record, default=jsonable, sort_keys=True))


def local(root):
    for directory, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            full = os.path.join(directory, name)
            path = os.path.relpath(full, root).replace(os.sep, "/")
            if not name.endswith(".avro"):
                raise SystemExit(f"not a capture file: {path}")
            with open(full, "rb") as f:
                print_records(path, f.read())


def s3(url, endpoint):
    import boto3

    bucket, _, prefix = url[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix + "/" if prefix else ""
    )
    for page in pages:
        for item in page.get("Contents", []):
            key = item["Key"]
            data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            print_records(key[len(prefix) + 1:] if prefix else key, data)


if __name__ == "__main__":
    if sys.argv[1].startswith("s3://"):
        s3(sys.argv[1], sys.argv[2])
    else:
        local(sys.argv[1])
