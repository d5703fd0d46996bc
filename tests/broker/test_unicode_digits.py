"""Text that ``str.isdigit`` calls digits but ``int`` refuses ("¹", "²", "③") is refused
with the error each parser documents, never a ValueError from ``int`` (each of these paths
checked ``isdigit()`` alone before converting client or peer input)."""

from __future__ import annotations

import pytest

from broker.config import _is_host_port, _is_ip
from broker.namesrv.routes import check_address
from broker.schedule import parse_src
from protocol.errors import InvalidParameterError, ReceiptError
from protocol.grpc.convert import decode_handle
from protocol.headers import plain_int

DIGIT_LOOKALIKES = ["¹", "²³", "③", "1¹"]


@pytest.mark.parametrize("text", DIGIT_LOOKALIKES)
def test_they_are_digits_to_isdigit_and_not_to_int(text: str) -> None:
    assert text.isdigit()
    with pytest.raises(ValueError, match="invalid literal"):
        int(text)


@pytest.mark.parametrize("text", DIGIT_LOOKALIKES)
def test_a_receipt_handle_offset(text: str) -> None:
    with pytest.raises(ReceiptError, match="not a number"):
        decode_handle(f"a b c d e f g h {text}")


@pytest.mark.parametrize("text", DIGIT_LOOKALIKES)
def test_a_registered_broker_address(text: str) -> None:
    with pytest.raises(InvalidParameterError, match="not HOST:PORT"):
        check_address(f"10.0.0.1:{text}")
    assert not _is_host_port(f"10.0.0.1:{text}")
    assert not _is_ip(f"10.0.0.{text}")


@pytest.mark.parametrize("text", DIGIT_LOOKALIKES)
def test_a_timer_source_property(text: str) -> None:
    assert parse_src(f"{text}:5") is None
    assert parse_src(f"3:{text}") is None
    assert parse_src("3:5") == (3, 5)


@pytest.mark.parametrize("text", DIGIT_LOOKALIKES)
def test_a_header_fast_path_number(text: str) -> None:
    assert plain_int(text, 9) is None
    assert plain_int(f"-{text}", 9, signed=True) is None
    assert plain_int("-12", 9, signed=True) == -12
    assert plain_int("-12", 9) is None
    assert plain_int("1234567890", 9) is None  # past the digits that always fit
