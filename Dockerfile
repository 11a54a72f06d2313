# The project image of docker-compose.yml: the library with every extra, Java for PySpark, and Spark's
# own launcher scripts from the pyspark wheel, so one image runs the coordinator, the exporter, the
# experiments, the demo and a Spark master/worker whose Python executors can import the aligned data source.
FROM python:3.11-slim-bookworm
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends default-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY aligner aligner
COPY connectors connectors
COPY coordinator coordinator
COPY experiments experiments
RUN pip install -q --no-cache-dir -e '.[local,plots,spark,faust]'
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark PYSPARK_PYTHON=python3 PYTHONUNBUFFERED=1
CMD ["python", "-m", "experiments.suite", "--help"]
