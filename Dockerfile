# One image for web, worker and beat. The embedding model folder is built at image build time.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 ICRLHF_VAR_DIR=/app/var
WORKDIR /app
COPY pyproject.toml README.md ./
COPY icrlhf ./icrlhf
COPY worker ./worker
COPY templates ./templates
COPY static ./static
COPY manage.py ./
RUN pip install --no-cache-dir . \
 && SECRET_KEY=build-only python manage.py build_models \
 && SECRET_KEY=build-only python manage.py collectstatic --noinput \
 && useradd --system --home /app icrlhf && chown -R icrlhf /app/var
USER icrlhf
EXPOSE 8000
CMD ["gunicorn", "icrlhf.wsgi", "--bind", "0.0.0.0:8000", "--workers", "4", "--threads", "4"]
