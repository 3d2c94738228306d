"""What several tests share about the loggers: reading the scalars a TensorBoard event file holds."""

import struct


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Scalars of TFRecord event files (8-byte length, 4-byte crc, the Event proto, 4-byte crc)."""
    from tensorboardX.proto.event_pb2 import Event

    out = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((event.step, round(v.simple_value, 6)))
    return out
