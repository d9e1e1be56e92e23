"""Settings that hold secrets are shown redacted (udf_agent.redaction)."""

from __future__ import annotations

import pytest

from udf_agent.redaction import REDACTED, is_secret, redacted_url, redacted_value


@pytest.mark.parametrize(
    "name",
    [
        "spark.authenticate.secret",
        "spark.ssl.keyPassword",
        "spark.ssl.rpc.keyStorePassword",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.access.key",
        "SPARK_AUTH_TOKEN",
        "api_key",
        "spark.kerberos.keytab",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ],
)
def test_a_setting_named_for_a_secret_is_redacted(name):
    assert is_secret(name)
    assert redacted_value(name, "hunter2") == REDACTED


@pytest.mark.parametrize("name", ["spark.sql.shuffle.partitions", "spark.authenticate", "spark.network.crypto.enabled", "spark.driver.host", "spark.cores.max"])
def test_other_settings_are_shown_as_they_are(name):
    assert not is_secret(name)
    assert redacted_value(name, "4") == "4"


def test_a_spark_connect_urls_token_is_redacted_and_the_rest_kept():
    assert (
        redacted_url("sc://spark.example:15002/;user_id=kapacitor;token=abc123;use_ssl=true")
        == f"sc://spark.example:15002/;user_id=kapacitor;token={REDACTED};use_ssl=true"
    )
    assert redacted_url("sc://127.0.0.1:15002") == "sc://127.0.0.1:15002"
    assert redacted_url("spark://a:7077,b:7077") == "spark://a:7077,b:7077"
