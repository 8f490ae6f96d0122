"""Build of the optional native kernels; everything else is in pyproject.toml.

``spherecal.crypto._maskkernel`` (crypto/_maskkernel.c) adds OpenSSL's AES-128-CTR
keystream into ring words in one pass (issue #24). It links the system libcrypto
(OpenSSL 3). ``optional=True``: where no compiler, Python headers or OpenSSL headers
are present the install goes on without it, and :mod:`spherecal.crypto.prg` uses its
numpy path, which gives the same bytes.

``spherecal.crypto._fastcodec`` (crypto/_fastcodec.c) runs the canonical encoding's
hot paths (issue #24: participant-id lists, the Harary cycle's order keys and the
contexts of every KDF and signature, per site and job), also with libcrypto and also
optional: without it the Python code that defines each runs.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "spherecal.crypto._maskkernel",
            sources=["crypto/_maskkernel.c", "crypto/_aesctr.c"],
            depends=["crypto/_aesctr.h", "crypto/_aesctr_body.h"],
            libraries=["crypto"],
            # no contraction into FMA: the encoding's rounding is defined on two IEEE ops
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-strict-aliasing"],
            optional=True,
        ),
        Extension(
            "spherecal.crypto._fastcodec",
            sources=["crypto/_fastcodec.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
