"""Object storage: fw's outputs at fsspec URLs (s3:// against moto's S3 server on 127.0.0.1, memory://)."""
