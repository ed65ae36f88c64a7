"""The S3 test fixtures themselves, checked with boto3: the server checks
signatures and refuses missing buckets, and the fault proxy forwards
signed requests unchanged and injects exactly the faults it is told to."""

import botocore.exceptions
import pytest

from s3_server import ACCESS_KEY_ID, boto3_client


def _error_code(excinfo) -> str:
    return excinfo.value.response["Error"]["Code"]


def test_server_checks_signatures(s3):
    s3.client.put_object(Bucket=s3.name, Key="a", Body=b"1")
    wrong = boto3_client(s3.endpoint_url, secret_access_key="not-the-secret")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        wrong.get_object(Bucket=s3.name, Key="a")
    assert _error_code(excinfo) == "SignatureDoesNotMatch"
    unknown = boto3_client(s3.endpoint_url, access_key_id="AKIAUNKNOWN")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        unknown.get_object(Bucket=s3.name, Key="a")
    assert _error_code(excinfo) == "InvalidAccessKeyId"
    assert s3.get("a") == b"1"


def test_missing_bucket_is_not_created_by_a_put(s3):
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.client.put_object(Bucket=s3.name + "-missing", Key="a", Body=b"1")
    assert _error_code(excinfo) == "NoSuchBucket"


def test_conditional_put_creates_once(s3):
    s3.client.put_object(Bucket=s3.name, Key="c", Body=b"1", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        s3.client.put_object(Bucket=s3.name, Key="c", Body=b"2", IfNoneMatch="*")
    assert _error_code(excinfo) == "PreconditionFailed"
    assert s3.get("c") == b"1"


def test_environment_names_the_server(s3):
    import os

    assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint_url
    assert os.environ["AWS_ACCESS_KEY_ID"] == ACCESS_KEY_ID
    assert s3.settings.endpoint_url == s3.endpoint_url


def test_proxy_forwards_signed_requests(s3, s3_proxy):
    through = boto3_client(s3_proxy.endpoint_url)
    big = bytes(range(256)) * (12 << 10)  # 3 MiB: boto3 sends Expect: 100-continue
    through.put_object(Bucket=s3.name, Key="big", Body=big)
    assert through.get_object(Bucket=s3.name, Key="big")["Body"].read() == big
    assert s3.get("big") == big
    upload = through.create_multipart_upload(Bucket=s3.name, Key="parts")
    part = through.upload_part(Bucket=s3.name, Key="parts", PartNumber=1,
                               UploadId=upload["UploadId"], Body=big)
    through.complete_multipart_upload(
        Bucket=s3.name, Key="parts", UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert s3.get("parts") == big
    assert [s.outcome for s in s3_proxy.seen] == ["forwarded"] * 5
    assert s3_proxy.injected() == 0


def test_proxy_injects_errors_on_matching_requests_only(s3, s3_proxy):
    through = boto3_client(s3_proxy.endpoint_url)
    s3_proxy.fail(2, status=503, code="SlowDown", method="PUT")
    s3.client.put_object(Bucket=s3.name, Key="k", Body=b"v")
    assert through.get_object(Bucket=s3.name, Key="k")["Body"].read() == b"v"  # not a PUT
    for _ in range(2):
        with pytest.raises(botocore.exceptions.ClientError) as excinfo:
            through.put_object(Bucket=s3.name, Key="k", Body=b"w" * 5000)
        assert _error_code(excinfo) == "SlowDown"
        assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    through.put_object(Bucket=s3.name, Key="k", Body=b"w")
    assert s3.get("k") == b"w"
    assert s3_proxy.injected() == 2

    s3_proxy.fail(1, status=500, code="InternalError", query="partNumber")
    upload = through.create_multipart_upload(Bucket=s3.name, Key="m")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        through.upload_part(Bucket=s3.name, Key="m", PartNumber=1,
                            UploadId=upload["UploadId"], Body=b"x")
    assert _error_code(excinfo) == "InternalError"
    through.abort_multipart_upload(Bucket=s3.name, Key="m", UploadId=upload["UploadId"])
    assert s3_proxy.injected() == 3


def test_proxy_drops_connections(s3, s3_proxy):
    through = boto3_client(s3_proxy.endpoint_url)
    s3_proxy.drop(1, method="PUT")
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        through.put_object(Bucket=s3.name, Key="d", Body=b"z" * 100_000)
    assert s3.keys() == []
    through.put_object(Bucket=s3.name, Key="d", Body=b"z")
    assert s3.get("d") == b"z"
    assert [s.outcome for s in s3_proxy.seen] == ["dropped", "forwarded"]


def test_server_restarts_with_its_data(s3, s3_server):
    s3.client.put_object(Bucket=s3.name, Key="kept", Body=b"1")
    s3_server.stop()
    assert not s3_server.running
    with pytest.raises(botocore.exceptions.EndpointConnectionError):
        s3.client.list_buckets()
    s3_server.start()
    assert s3.get("kept") == b"1"


def test_server_restarts_when_another_program_took_one_of_its_ports(s3, s3_server):
    """CI once failed here: while the server was stopped, another program
    bound one of its ports, and the restart exited."""
    import socket

    s3.client.put_object(Bucket=s3.name, Key="kept", Body=b"1")
    endpoint = s3_server.endpoint_url
    s3_server.stop()
    taken = s3_server.ports["filer.port"]
    with socket.socket() as squatter:
        # The port may be in TIME_WAIT; listening still keeps weed off it.
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        s3_server.start()
    assert s3_server.endpoint_url == endpoint
    assert s3_server.ports["filer.port"] != taken
    assert s3.get("kept") == b"1"


def test_proxy_lets_the_first_requests_through_and_holds_others(s3, s3_proxy):
    import threading

    through = boto3_client(s3_proxy.endpoint_url)
    s3_proxy.fail(1, status=403, code="AccessDenied", method="PUT", after=2)
    through.put_object(Bucket=s3.name, Key="1", Body=b"1")
    through.put_object(Bucket=s3.name, Key="2", Body=b"2")
    with pytest.raises(botocore.exceptions.ClientError) as excinfo:
        through.put_object(Bucket=s3.name, Key="3", Body=b"3")
    assert _error_code(excinfo) == "AccessDenied"
    assert s3.keys() == ["1", "2"]
    s3_proxy.hold(1, method="GET")
    got = []
    reader = threading.Thread(
        target=lambda: got.append(through.get_object(Bucket=s3.name, Key="1")["Body"].read()))
    reader.start()
    s3_proxy.wait_held()
    assert got == []
    s3_proxy.release()
    reader.join(10)
    assert got == [b"1"]
