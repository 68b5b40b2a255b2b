"""Decoding, validating and (when needed) converting one image with Pillow.

``prepare_image(data, options)`` returns the bytes to store and what the
Example records about them (format, height, width, and the channel count
``tf.io.decode_image(data, expand_animations=False)`` produces), or raises
``Rejected`` with a reason code. Every input is decoded (every frame of an
animation), so nothing is written broken; a JPEG stored as it is decodes at
1/8 scale, which reads every bit of its compressed data (see ``_decode``).

Cost is bounded before anything is decoded (``measure``): from the headers
alone, every frame's canvas (GIF frames may declare extents far larger than
the logical screen, and Pillow grows the canvas to them), the frame count,
the pixels of all frames together and a JPEG's scan count are checked against
``ImageOptions``; the memory a decode needs is estimated from the same numbers
so the writer can hold it in a per-process budget (``prepare_image(reserve=)``).
Nothing here changes Pillow's process-wide settings: files are opened without
``Image.open``'s global pixel check (``_pillow_open``), and this module's own
limits, which are the run's, apply instead.

Policy (README, "Formats"):
- a file TensorFlow reads back at its recorded shape is stored as it is
  (its original bytes), unless a pixel option asks otherwise;
- anything else Pillow can decode (CMYK JPEG, TIFF, palette BMP, ICO, …) is
  converted to PNG (lossless), or to JPEG with ``--reencode jpeg:Q``;
  ``on_unsupported="reject"`` rejects it as ``unsupported_format`` instead;
- pixel options (EXIF orientation, resize) re-encode: JPEG sources as JPEG
  (quality 95 or ``--reencode``), others as PNG.

    from beam_pipeline.images.convert import prepare_image
    from beam_pipeline.images.options import ImageOptions

    prepared = prepare_image(open("cat.jpg", "rb").read(), ImageOptions())
    prepared.info.format, prepared.info.channels, prepared.data

The package: ``options`` (limits, options and results), ``headers`` (byte-level structure, no decode),
``check`` (cost from headers, TensorFlow's reading, the decode) and ``convert`` (the bytes a record stores).
"""
