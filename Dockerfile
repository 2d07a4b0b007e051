# One image for web, worker and beat, portable to any x86-64 CPU with AVX2.
#
# The local LLM's runtime (llama.cpp's server, for those who run the bundled model in the
# image) is compiled in a build stage by tools/install-llm with the portable flags, never for
# the CPU of the machine that builds the image: an image travels to other CPUs.
FROM python:3.12-slim AS llm-build
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY tools/install-llm ./tools/
ENV ICRLHF_WHEELHOUSE=/wheels
RUN python -m venv /venv && tools/install-llm /venv/bin/pip

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 ICRLHF_VAR_DIR=/app/var
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY --from=llm-build /venv/bin/llama-server /usr/local/bin/llama-server
COPY pyproject.toml README.md LICENSE ./
COPY docs ./docs
COPY icrlhf ./icrlhf
COPY worker ./worker
COPY templates ./templates
COPY static ./static
COPY tools ./tools
COPY manage.py ./
RUN pip install --no-cache-dir . \
 && SECRET_KEY=build-only python manage.py build_models --llm \
 && SECRET_KEY=build-only python manage.py collectstatic --noinput \
 && useradd --system --home /app icrlhf && chown -R icrlhf /app/var
USER icrlhf
EXPOSE 8000
CMD ["gunicorn", "icrlhf.wsgi", "--bind", "0.0.0.0:8000", "--workers", "4", "--threads", "4"]
