"""POST /api/v1/estimates/: the pre-launch VRAM estimate, with no side effects."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import exceptions, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

import estimator
from gpuplatform.api.errors import error_body
from gpuplatform.api.scopes import READ

from ...hub import THROTTLED, hub_reader


def estimator_error_response(exc: "estimator.EstimatorError") -> Response:
    field = exc.field or "non_field_errors"
    return Response(
        error_body(
            "validation_error",
            f"{field}: {exc.message}",
            {field: [{"code": exc.code, "message": exc.message}]},
        ),
        status=status.HTTP_400_BAD_REQUEST,
    )


class EstimateView(APIView):
    """Estimate a job's peak VRAM and compare it with a tier. Anyone may call it
    (anonymous callers are throttled, and a Hub model not read before is charged to a
    stricter budget: hub_read_anon / hub_read_user); nothing is stored."""

    required_scope = READ
    permission_classes = [AllowAny]

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT},
        examples=[
            OpenApiExample(
                "Llama 3.1 8B, bf16, 8k context, on the 24 GB tier",
                value={
                    "model": {"catalog": "meta-llama/Llama-3.1-8B"},
                    "workload": "inference",
                    "weights_dtype": "bf16",
                    "context_tokens": 8192,
                    "batch": 1,
                    "tier_mib": 24576,
                },
                request_only=True,
            ),
            OpenApiExample(
                "A model read from the Hugging Face Hub (config.json and safetensors headers)",
                value={
                    "model": {"hub": "Qwen/Qwen3-8B", "revision": "main"},
                    "weights_dtype": "bf16",
                    "context_tokens": 8192,
                    "tier_mib": 24576,
                },
                request_only=True,
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            return Response(
                error_body(
                    "validation_error",
                    "Expected a JSON object.",
                    {
                        "non_field_errors": [
                            {"code": "invalid", "message": "Expected a JSON object."}
                        ]
                    },
                ),
                status=status.HTTP_400_BAD_REQUEST,
            )
        try:
            result = estimator.estimate(
                estimator.EstimateRequest.from_mapping(request.data, hub=hub_reader(request))
            )
        except estimator.EstimatorError as exc:
            if exc.code == THROTTLED:  # a budget of uncached Hub reads per caller: a 429
                wait = getattr(exc.__cause__, "wait", None)
                raise exceptions.Throttled(wait=wait, detail=exc.message) from exc
            return estimator_error_response(exc)
        return Response(result.to_dict())


class CatalogView(APIView):
    """The models the estimator knows by name, with their source."""

    permission_classes = [AllowAny]

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        rows = [
            {"name": name, "params": estimator.param_count(spec), "source": spec.source}
            for name, spec in sorted(estimator.CATALOG.items())
        ]
        return Response({"count": len(rows), "results": rows})
