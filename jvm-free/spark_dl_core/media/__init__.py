"""Image, audio and video codecs and pipelines; they register into ``ops``."""
