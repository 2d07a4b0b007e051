import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.models import Item, Queue
from icrlhf.queues.roles import curator_permissions_grant


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"reviewer{n}")
    password = factory.django.Password("pass-for-tests")

    @factory.post_generation
    def roles(self, create: bool, extracted: list[str] | None, **kwargs: object) -> None:
        """Groups the user is in; a reviewer unless the test says otherwise."""
        names = ["reviewer"] if extracted is None else extracted
        # get_or_create: transactional tests flush the groups the migration made, and the
        # permissions granted after migrating.
        if create and names:
            self.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in names))
            curator_permissions_grant(group_model=Group, permission_model=Permission)


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Queue
        skip_postgeneration_save = True

    slug = factory.Sequence(lambda n: f"queue-{n}")
    name = factory.Sequence(lambda n: f"Queue {n}")
    n_candidates = 3

    @factory.post_generation
    def members(self, create: bool, extracted: list[object] | None, **kwargs: object) -> None:
        if create and extracted:
            self.members.add(*extracted)


class ItemFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Item

    queue = factory.SubFactory(QueueFactory)
    input_text = factory.Sequence(lambda n: f"Question number {n}?")
    status = Item.Status.READY


def ready_generation(item: Item, texts: list[str]) -> Generation:
    """A finished generation with one done candidate per text (no model involved)."""
    generation = Generation.objects.create(
        item=item,
        model="openai/test-model",
        params={},
        n_candidates=len(texts),
        status=Generation.Status.DONE,
        messages=[{"role": "user", "content": item.input_text}],
    )
    for position, text in enumerate(texts):
        Candidate.objects.create(
            generation=generation, position=position, text=text, status=Candidate.Status.DONE
        )
    return generation
